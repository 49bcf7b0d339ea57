"""The README and the docs cite only what the repository holds.

Every relative markdown link in README.md, docs/*.md and benchmarks/README.md resolves from the
page's own folder, and every repository path named in their text (`benchmarks/...`, `docs/...`:
a result file, a benchmark, a page) exists from the repository root. A path may name the stem a
command writes beside (`--out benchmarks/results/tree-tau-builtin-cpu` writes `.json` and `.md`).
The README stays a guide: under 200 lines, its test command the one .ci/run runs.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A repository path in running text or a command: not the tail of a longer path or a URL.
PATH = re.compile(r"(?<![\w./-])((?:benchmarks|docs)/[\w./-]*[\w/])")


def _exists(path: Path) -> bool:
    return path.exists() or (path.parent.is_dir() and any(path.parent.glob(path.name + ".*")))


def broken_links(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    broken = []
    for match in LINK.finditer(text):
        target = match.group(1).split("#")[0]
        if target and not re.match(r"[a-z][a-z0-9+.-]*:", target) and not (page.parent / target).exists():
            broken.append(f"link {target}")
    for match in PATH.finditer(text):
        if not _exists(ROOT / match.group(1)):
            broken.append(f"path {match.group(1)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_file_exists(page):
    assert broken_links(page) == [], f"{page.relative_to(ROOT)} cites what the repository does not hold"


def test_a_missing_file_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("See [the run](missing.json) and benchmarks/results/no-such-run-cpu.json.\n")
    assert broken_links(page) == ["link missing.json", "path benchmarks/results/no-such-run-cpu.json"]


def test_the_readme_is_a_guide():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 200
    # .ci/run runs the README's test command on a clean clone.
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip install -e ".[test,agents]" && python -m pytest' in readme
    assert 'pip install -q -e ".[test,agents]" && python -m pytest' in ci
