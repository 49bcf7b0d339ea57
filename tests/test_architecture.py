"""The package's layers, checked from its source (docs/architecture.md).

Every import inside the package (module level or inside a function) is an
edge. The graph must have no cycle, and an edge between two rooms must point
down: cli → tools → train → text / loading → engine → kernels → ground.
`text` and `loading` sit side by side and do not import each other.

Inside `engine/` the sub-rooms have ranks of their own (docs/architecture.md):
the shared rules (sampling, window, logit transform) at the bottom; `target/`
and `drafter/` beside each other (neither imports the other); `pair` above
both; the decode room's state and cycle pieces; `tree/`, which uses that state
but not the loop; the decode loop; `adaptive/` on top.
"""

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dflash2_mlx"
# Source folders and the package names they install as (pyproject's package-dir).
SOURCES = {ROOT / "dflash2_mlx": PACKAGE, ROOT / "cli": f"{PACKAGE}.cli", ROOT / "metal": f"{PACKAGE}.metal"}
# Room -> rank; an import may only go to a lower rank (or stay in its room).
RANKS = {"ground": 0, "metal": 0, "kernels": 1, "engine": 2, "loading": 3, "text": 3,
         "train": 4, "tools": 5, "serve": 5, "cli": 6}
# Engine sub-room -> rank, by the longest matching module prefix. Equal ranks
# in different sub-rooms may not import each other.
ENGINE = "dflash2_mlx.engine"
ENGINE_RANKS = {
    f"{ENGINE}.sampling": 0, f"{ENGINE}.window": 0, f"{ENGINE}.logit_transform": 0, f"{ENGINE}.grammar": 0,
    f"{ENGINE}.kv_buckets": 0, f"{ENGINE}.residency": 0,
    f"{ENGINE}.request": 1,  # a decode request: built on the rules (sampling, grammar)
    f"{ENGINE}.target": 1, f"{ENGINE}.drafter": 1,
    f"{ENGINE}.pair": 2,
    f"{ENGINE}.decode": 3,
    f"{ENGINE}.tree": 4,
    f"{ENGINE}.decode.loop": 5,
    f"{ENGINE}.adaptive": 6,
    f"{ENGINE}.batch": 7,
    f"{ENGINE}.plan": 8,  # a request's plan: it settles what the loops and the policies will do
}
# The package root re-exports the public API lazily (by name, not by import).
FACADE = PACKAGE


def module_files() -> dict[str, Path]:
    out = {}
    for folder, name in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([name, *parts])] = path
    return out


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Package modules `module` imports anywhere in its file."""
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import name` imports pkg.name when that is a module.
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # `import a.b.c` of a package attribute
                name = name.rpartition(".")[0]
            if name.startswith(PACKAGE) and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {m: imports_of(m, p, known) for m, p in files.items()}


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in RANKS:
        return "ground"  # errors, device, files, the builtin data package
    return parts[1]


def engine_room(module: str) -> str:
    """The engine sub-room of `module` (the longest listed prefix); "" outside them."""
    best = ""
    for prefix in ENGINE_RANKS:
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
            best = prefix
    return best


def engine_upward_edges(graph: dict[str, set[str]]) -> list[str]:
    """Edges between engine sub-rooms that do not point to a lower rank."""
    bad = []
    for src, dsts in graph.items():
        a = engine_room(src)
        for dst in dsts:
            b = engine_room(dst)
            if a and b and a != b and ENGINE_RANKS[b] >= ENGINE_RANKS[a]:
                bad.append(f"{src} ({a}) imports {dst} ({b})")
    return sorted(bad)


def test_every_engine_module_has_a_sub_room():
    loose = [m for m in module_files() if m.startswith(ENGINE + ".") and not engine_room(m)]
    assert loose == []


def test_engine_sub_rooms_only_import_down():
    assert engine_upward_edges(import_graph()) == []


@pytest.mark.parametrize("src, dst", [
    # Each inner rule must be able to fail on a planted violation.
    (f"{ENGINE}.target.adapter", f"{ENGINE}.drafter.model"),  # siblings
    (f"{ENGINE}.drafter.model", f"{ENGINE}.target.adapter"),
    (f"{ENGINE}.target.caches", f"{ENGINE}.pair"),  # below the pair
    (f"{ENGINE}.pair", f"{ENGINE}.decode.state"),
    (f"{ENGINE}.tree.cycle", f"{ENGINE}.decode.loop"),  # the tree uses state, not the loop
    (f"{ENGINE}.decode.chain", f"{ENGINE}.tree.build"),  # the chain knows no tree
    (f"{ENGINE}.decode.loop", f"{ENGINE}.adaptive.policy"),  # the loop takes a policy, imports none
    (f"{ENGINE}.sampling", f"{ENGINE}.target.adapter"),  # the rules are the floor
    (f"{ENGINE}.window", f"{ENGINE}.drafter.model"),
])
def test_engine_rules_catch_planted_violations(src, dst):
    planted = {src: {dst}, dst: set()}
    assert engine_upward_edges(planted) == [f"{src} ({engine_room(src)}) imports {dst} ({engine_room(dst)})"]


@pytest.mark.parametrize("src, dst", [
    (f"{ENGINE}.tree.cycle", f"{ENGINE}.decode.state"),
    (f"{ENGINE}.decode.loop", f"{ENGINE}.tree.cycle"),
    (f"{ENGINE}.pair", f"{ENGINE}.target.adapter"),
    (f"{ENGINE}.adaptive.calibrate", f"{ENGINE}.decode.loop"),
])
def test_engine_rules_allow_the_arrows_down(src, dst):
    assert engine_upward_edges({src: {dst}, dst: set()}) == []


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, dsts in graph.items():
        if src == FACADE:
            continue
        for dst in dsts:
            a, b = room(src), room(dst)
            if a != b and RANKS[b] >= RANKS[a] and dst != FACADE:
                bad.append(f"{src} ({a}) imports {dst} ({b})")
            if dst == FACADE and src != FACADE:
                bad.append(f"{src} imports the package root (import the module that defines the name)")
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    graph = import_graph()
    # A few edges every version of the package has: the reader must see them.
    assert "dflash2_mlx.engine.pair" in graph["dflash2_mlx.engine.decode.loop"]
    assert "dflash2_mlx.kernels.registry" in graph["dflash2_mlx.engine.drafter.conv"]
    assert any(d.startswith("dflash2_mlx.loading") for d in graph["dflash2_mlx.cli.generate"])
    assert len(graph) > 60


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_imports_only_go_down():
    assert upward_edges(import_graph()) == []


def test_the_library_never_imports_the_cli_typer_or_rich():
    for module, path in module_files().items():
        if room(module) == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in ("typer", "rich"), f"{module} imports {name}"


def test_the_library_never_reads_environment_variables():
    for module, path in module_files().items():
        if room(module) == "cli":
            continue
        text = path.read_text()
        assert "os.environ" not in text and "getenv" not in text, module


@pytest.mark.parametrize("graph, found", [
    # The checks themselves must be able to fail.
    ({"dflash2_mlx.engine.decode.loop": {"dflash2_mlx.tools.bench"}, "dflash2_mlx.tools.bench": set()}, "up"),
    ({"dflash2_mlx.text.generate": {"dflash2_mlx.loading.hub"}, "dflash2_mlx.loading.hub": set()}, "up"),
    ({"dflash2_mlx.kernels.metal_cuda": {"dflash2_mlx.engine.drafter.conv"}, "dflash2_mlx.engine.drafter.conv": set()}, "up"),
    ({"dflash2_mlx.engine.a": {"dflash2_mlx.engine.b"}, "dflash2_mlx.engine.b": {"dflash2_mlx.engine.a"}}, "cycle"),
    ({"dflash2_mlx.cli.x": {"dflash2_mlx.engine.a"}, "dflash2_mlx.engine.a": set()}, None),
])
def test_the_checks_catch_planted_violations(graph, found):
    assert bool(upward_edges(graph)) == (found == "up")
    assert bool(cycles(graph)) == (found == "cycle")


def checkout_files() -> list[str]:
    """What a fresh clone of this checkout holds, with the working tree's changes:
    tracked files and untracked ones that git does not ignore."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def installed_name(path: str) -> str | None:
    """Where a source file lands in the wheel (None: outside the package's folders)."""
    for folder, name in SOURCES.items():
        prefix = folder.relative_to(ROOT).as_posix() + "/"
        if path.startswith(prefix):
            return name.replace(".", "/") + "/" + path[len(prefix):]
    return None


@pytest.mark.slow
def test_the_wheel_ships_every_file_of_the_package(tmp_path):
    """A wheel built from a copy of the checkout holds every file under the package's
    folders (modules in folders with or without `__init__.py`, the built-in pair, the
    page, the kernel sources) and nothing else; editable installs never notice a miss."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files of a clone cannot be listed")
    files = checkout_files()
    tree = tmp_path / "clone"
    for name in files:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    # The build requirements come with the test extra (no build isolation: nothing is downloaded).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(tree)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("dflash2_mlx-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if not n.split("/")[0].endswith(".dist-info")}
    expected = {installed_name(f) for f in files} - {None}
    assert expected - shipped == set(), "files left out of the wheel"
    assert shipped - expected == set(), "files in the wheel that the checkout does not have"


# Sizes that keep a room readable: an engine function fits a screen, a module
# has one job. (docs/architecture.md)
MAX_ENGINE_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400


def long_functions(source: str, limit: int = MAX_ENGINE_FUNCTION_LINES) -> list[str]:
    return [f"{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def test_no_engine_function_over_80_lines():
    found = {m: long_functions(p.read_text()) for m, p in module_files().items() if m.startswith(ENGINE)}
    assert {m: f for m, f in found.items() if f} == {}


def test_no_module_over_400_lines():
    sizes = {m: len(p.read_text().splitlines()) for m, p in module_files().items()}
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_the_size_checks_can_fail():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_ENGINE_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n") == [f"f: {MAX_ENGINE_FUNCTION_LINES + 1} lines"]
    assert long_functions(f"def f():\n{body}\n".replace("    x0 = 0\n", "")) == []
