"""MkDocs hooks (mkdocs.yml, ``hooks:``) for the documentation site.

- A fenced block's info string names how the tests run it (``python spark``, ``python
  fragment``: tests/docs/test_markdown_blocks.py); Markdown takes one word there, so the page is
  rendered with ``python`` alone.
- The benchmark report that ``xorack bench --out benchmarks/results`` writes is a page of the
  site as it is (``performance/report.md``, with its plot and the raw results beside it), so
  the site shows the measured report, never a copy of it.
- ``<!-- include: examples/NAME.py -->`` on a line of its own shows that example's source (the
  page's Markdown holds no copy, so the tests run the script itself: tests/docs/test_examples.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"
# (file under benchmarks/results, where the site serves it)
GENERATED = [
    ("report.md", "performance/report.md"),
    ("report.png", "performance/report.png"),
    ("report.json", "performance/results/report.json"),
    ("repair.txt", "performance/results/repair.txt"),
    ("kernels-pytest-benchmark.txt", "performance/results/kernels-pytest-benchmark.txt"),
]
KIND_WORD = re.compile(r"^(\s{0,3}`{3,}\s*python)\s+(spark|fragment)\s*$", re.MULTILINE)
INCLUDE = re.compile(r"^<!-- include: (examples/[\w./-]+\.py) -->$", re.MULTILINE)


def on_files(files: Files, config: Any) -> Files:
    """Add the benchmark results (kept in benchmarks/results, not in docs/) to the site."""
    for name, dest in GENERATED:
        files.append(File.generated(config, dest, abs_src_path=str(ROOT / RESULTS / name)))
    return files


def _include(match: re.Match[str]) -> str:
    path = ROOT / match.group(1)
    return f"`{match.group(1)}`:\n\n```python\n{path.read_text().rstrip()}\n```"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Render ``python spark``/``python fragment`` blocks as Python; expand example includes."""
    markdown = KIND_WORD.sub(r"\1", markdown)
    return INCLUDE.sub(_include, markdown)
