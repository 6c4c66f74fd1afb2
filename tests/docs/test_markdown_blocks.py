"""Every Python code block of the README and of the documentation site (docs/**/*.md) runs (see
"Code blocks in the documentation" in docs/development.md): a block opened with ``python`` runs
as is, ``python spark`` runs too (marked ``spark``), ``python fragment`` is only compiled. Each
block runs in its own interpreter, in a fresh temporary directory, so that a block cannot lean on
another one or on this checkout. A block that would escape the tests (a Python-like info string
the reader does not know, an unmarked block of Python) is an error, not a skip."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^( {0,3})(`{3,})([^`]*)$")
KINDS = {"python": "run", "python spark": "spark", "python fragment": "fragment"}
# info strings that name Python: a block opened with one of them must use one of KINDS exactly
PYTHON_WORDS = {"python", "python3", "py", "py3", "pycon", "ipython", "pyi"}


def _looks_like_python(body: list[str]) -> bool:
    """An unmarked block that parses as Python and imports something is code, not output."""
    code = "\n".join(body)
    if not re.search(r"^(import|from) \w", code, re.MULTILINE):
        return False
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def python_blocks(text: str, name: str = "README.md") -> list[tuple[int, str, str]]:
    """(line of the opening fence, kind, code) of every fenced block whose info string starts
    with python."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), " ".join(m.group(3).split())
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not re.match(rf"^ {{0,3}}{fence}`*\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i])
            i += 1
        i += 1
        word = info.split(" ")[0].lower()
        if word in PYTHON_WORDS:
            if info not in KINDS:
                raise AssertionError(
                    f"{name}:{start}: unknown info string {info!r}; use one of {sorted(KINDS)}"
                )
            blocks.append((start, KINDS[info], "\n".join(body) + "\n"))
        elif not info and _looks_like_python(body):
            raise AssertionError(
                f"{name}:{start}: a block of Python without an info string would not be tested;"
                f" open it with one of {sorted(KINDS)} (or `text` for output)"
            )
    return blocks


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


BLOCKS = [
    (_name(page), line, kind, code)
    for page in PAGES
    for line, kind, code in python_blocks(page.read_text(), _name(page))
]


def _params():
    out = []
    for name, line, kind, code in BLOCKS:
        marks = [pytest.mark.spark, pytest.mark.slow] if kind == "spark" else []
        out.append(pytest.param(name, line, kind, code, marks=marks, id=f"{name}:{line}-{kind}"))
    return out


def test_the_pages_have_runnable_python_blocks():
    kinds = [kind for _name, _line, kind, _code in BLOCKS]
    # the README and docs/ held 5 plain, 5 Spark and 3 compiled-only blocks when the site was
    # made: a block moved out of every page (or into a file no test reads) fails here
    assert kinds.count("run") >= 5
    assert kinds.count("spark") >= 5
    assert kinds.count("fragment") >= 3
    assert any(name == "README.md" and kind == "spark" for name, _l, kind, _c in BLOCKS)
    assert {name for name, *_ in BLOCKS} > {"README.md"}, "no block of docs/ is collected"


def test_the_block_reader_follows_the_convention():
    text = "x\n```python\na = 1\n```\n  ```python fragment\n  b(\n  ```\n```bash\nls\n```\n"
    assert python_blocks(text) == [(2, "run", "a = 1\n"), (5, "fragment", "b(\n")]
    with pytest.raises(AssertionError, match="unknown info string 'python maybe'"):
        python_blocks("```python maybe\n```\n")
    with pytest.raises(AssertionError, match=r"x.md:1: unknown info string 'py'"):
        python_blocks("```py\na = 1\n```\n", "x.md")
    with pytest.raises(AssertionError, match="a block of Python without an info string"):
        python_blocks("```\nimport os\nprint(os.sep)\n```\n")
    # output and diagrams stay unmarked
    assert python_blocks("```\nxorack demo report\n  from here on: text\n```\n") == []


def test_the_site_renders_every_kind_as_python():
    """The site's hook strips the kind word that Markdown cannot read (tools/mkdocs_hooks.py)."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: install xorack[docs]")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import mkdocs_hooks
    finally:
        sys.path.remove(str(ROOT / "tools"))
    for info in KINDS:
        page = f"text\n\n```{info}\nx = 1\n```\n"
        assert mkdocs_hooks.on_page_markdown(page, None, None, None) == page.replace(info, "python")


@pytest.mark.parametrize(("name", "line", "kind", "code"), _params())
def test_markdown_block(name, line, kind, code, tmp_path):
    if kind == "fragment":
        compile(code, f"{name}:{line}", "exec")
        return
    if kind == "spark":
        pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{name}:{line} failed:\n{proc.stdout}\n{proc.stderr}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [], f"a block of {name} wrote into its cwd"


def test_the_site_shows_the_readme_commands():
    """The two commands (install + demo, install + tests) read the same on both front pages."""
    commands = re.findall(r"```bash\n(.*?)```", README.read_text(), re.DOTALL)[:2]
    assert len(commands) == 2
    assert all("pip install" in c for c in commands)
    index = (ROOT / "docs" / "index.md").read_text()
    for command in commands:
        assert f"```bash\n{command}```" in index
