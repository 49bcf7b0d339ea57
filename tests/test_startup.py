"""What `dflash2 generate` pays for before its first token.

The whole command is compared with `mlx_lm.generate` in benchmarks/results/lean-cycle.md;
these tests keep what made it as quick from quietly coming back: the modules
a plain `generate` must not import (each is tens of milliseconds: pydantic
arrives with Typer 0.29, Rich with the notices, the trainer, server and
benchmark tools with their commands) and the frozen GC generation the engine
imports are kept in.
"""

import subprocess
import sys

from cli_process import Sandbox

# Run through the console script's own entry, in a child so the imports start cold.
CHILD = """
import atexit, gc, sys
atexit.register(lambda: print("MODULES", " ".join(sorted(sys.modules)), "FROZEN", gc.get_freeze_count(),
                              file=sys.stderr))
sys.argv = ["dflash2", "generate", "-p", "def fib(n):", "-m", "1"]
from dflash2_mlx.cli.entry import main
main()
"""

NOT_FOR_GENERATE = ("pydantic", "rich", "starlette", "uvicorn", "dflash2_mlx.train", "dflash2_mlx.tools.bench",
                    "dflash2_mlx.tools.compare", "dflash2_mlx.serve", "dflash2_mlx.cli.ui")


def test_generate_imports_only_what_it_uses_and_freezes_them(tmp_path):
    box = Sandbox(tmp_path)
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=box.root, env=box.env,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("MODULES "))
    modules, frozen = line[len("MODULES "):].rsplit(" FROZEN ", 1)
    modules = set(modules.split())
    assert "mlx_lm" in modules and "dflash2_mlx.engine.decode.loop" in modules  # it did load and decode
    unwanted = sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_FOR_GENERATE))
    assert unwanted == []
    # The engine's ~10^5 import-time objects were frozen out of later collections.
    assert int(frozen) > 50_000
    assert p.stdout  # the token
