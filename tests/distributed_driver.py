"""One rank of the sharded-decode test: `mlx.launch -n 2 --backend ring python
tests/distributed_driver.py SPEC.json OUT_DIR`. For each family in SPEC: loads
the target split over the ranks and the drafters whole, runs
`distributed_cases.run_cases`; writes OUT_DIR/rank-R.json. Not a test module
itself (pytest does not collect it)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import mlx.core as mx  # noqa: E402

from dflash2_mlx.loading.checkpoints import load_drafter, load_target  # noqa: E402

from distributed_cases import run_cases  # noqa: E402


def main(spec_path: str, out_dir: str) -> None:
    specs = json.loads(Path(spec_path).read_text())  # family -> spec
    group = mx.distributed.init(strict=True)
    results = {}
    for family, spec in specs.items():
        target, _ = load_target(spec["target"], group=group, time_collectives=False)  # counts only
        drafters = {kind: load_drafter(path) for kind, path in spec["drafters"].items()}
        out = run_cases(target, drafters, spec["cases"], spec["max_tokens"])
        out["ranks"] = group.size()
        out["collectives_per_pass"] = target.collectives.collectives / max(target.collectives.passes, 1)
        results[family] = out
    Path(out_dir, f"rank-{group.rank()}.json").write_text(json.dumps(results))

if __name__ == "__main__":
    main(*sys.argv[1:3])
