"""The front door: a short README whose links all resolve, and a docs/ site that builds with `mkdocs --strict`
(broken links or anchors between pages fail it)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(md: Path) -> set[str]:
    """mkdocs' default slugs of a page's headings (lower case, punctuation dropped, spaces to hyphens)."""
    slugs = set()
    for line in md.read_text().splitlines():
        if line.startswith("#") and not line.startswith("#!"):
            title = line.lstrip("#").strip().lower()
            slugs.add(re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", title)).strip("-"))
    return slugs


def test_readme_is_a_front_door_whose_links_resolve_and_every_docs_page_is_in_the_site_navigation() -> None:
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 150
    links = [m for m in LINK.findall(readme.read_text()) if not m.startswith(("http://", "https://"))]
    assert links, "the README links its documentation pages"
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), f"README links {link}: {target} does not exist"
        if anchor:
            assert anchor in _anchors(target), f"README links {link}: no heading with that anchor"
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    missing = [p for p in pages if p not in nav]
    assert not missing, f"docs pages missing from mkdocs.yml nav: {missing}"


COMMAND_FILE = re.compile(r"(?<![\w/.])((?:scripts|tools)/[a-z]\w*\.(?:py|sh))")
COMMAND_MODULE = re.compile(r"(?:python3?|\$\(PY\)) -m ((?:scripts|tools)\.\w+)")


def test_the_docs_name_command_lines_and_tools_that_exist() -> None:
    """Every file and `python -m` module of the command lines and tools that the README, the docs, the Makefile, CI
    and the tests name exists (a moved or renamed one fails here, not in a reader's shell)."""
    pages = [ROOT / "README.md", ROOT / "Makefile", ROOT / ".ci" / "run", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "tests").glob("*.py"))]
    named = {(p.relative_to(ROOT).as_posix(), m) for p in pages for m in COMMAND_FILE.findall(p.read_text())}
    named |= {(p.relative_to(ROOT).as_posix(), m.replace(".", "/") + ".py") for p in pages
              for m in COMMAND_MODULE.findall(p.read_text())}
    assert len({m for _, m in named}) >= 10, named  # the pattern still finds them
    missing = sorted((page, m) for page, m in named if not (ROOT / m).is_file())
    assert not missing, missing


@pytest.mark.skipif(shutil.which("mkdocs") is None and not (Path(sys.executable).parent / "mkdocs").exists(),
                    reason="mkdocs is not installed (pip install -e '.[dev]')")
def test_docs_site_builds_strict(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "mkdocs"
    cmd = [str(exe) if exe.exists() else "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").exists()
