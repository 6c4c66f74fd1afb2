"""Every Python code block of the README runs (see "README code blocks" in its Development
section): a block opened with ``python`` runs as is, ``python spark`` runs too (marked
``spark``), ``python fragment`` is only compiled. Each block runs in its own interpreter, in a
fresh temporary directory, so that a block cannot lean on another one or on this checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
FENCE = re.compile(r"^( {0,3})(`{3,})([^`]*)$")
KINDS = {"python": "run", "python spark": "spark", "python fragment": "fragment"}


def python_blocks(text: str) -> list[tuple[int, str, str]]:
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
        if info.split(" ")[0] == "python":
            if info not in KINDS:
                raise AssertionError(
                    f"README.md:{start}: unknown info string {info!r}; use one of {sorted(KINDS)}"
                )
            blocks.append((start, KINDS[info], "\n".join(body) + "\n"))
    return blocks


BLOCKS = python_blocks(README.read_text())


def _params():
    out = []
    for line, kind, code in BLOCKS:
        marks = [pytest.mark.spark, pytest.mark.slow] if kind == "spark" else []
        out.append(pytest.param(line, kind, code, marks=marks, id=f"README.md:{line}-{kind}"))
    return out


def test_the_readme_has_runnable_python_blocks():
    kinds = [kind for _line, kind, _code in BLOCKS]
    assert kinds.count("run") >= 4
    assert "spark" in kinds


def test_the_block_reader_follows_the_convention():
    text = "x\n```python\na = 1\n```\n  ```python fragment\n  b(\n  ```\n```bash\nls\n```\n"
    assert python_blocks(text) == [(2, "run", "a = 1\n"), (5, "fragment", "b(\n")]
    with pytest.raises(AssertionError, match="unknown info string 'python maybe'"):
        python_blocks("```python maybe\n```\n")


@pytest.mark.parametrize(("line", "kind", "code"), _params())
def test_readme_block(line, kind, code, tmp_path):
    if kind == "fragment":
        compile(code, f"README.md:{line}", "exec")
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
    assert proc.returncode == 0, f"README.md:{line} failed:\n{proc.stdout}\n{proc.stderr}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a README block wrote into its cwd"
