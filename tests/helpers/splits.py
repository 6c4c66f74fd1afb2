"""Random micro-batch splits of a file stream's input (the property tests of the streams)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path


def resplit(directory: Path, seed: int, most: int = 5) -> list[int]:
    """Rewrite the JSON-lines files of ``directory`` (read oldest first) as files of 1 to
    ``most`` lines in the same line order, sized at random from ``seed``; one file per
    micro-batch with ``maxFilesPerTrigger=1``. Returns the sizes."""
    rng = random.Random(seed)
    old = sorted(directory.iterdir(), key=lambda p: p.stat().st_mtime)
    lines = [line for path in old for line in path.read_text().splitlines(keepends=True)]
    for path in old:
        path.unlink()
    sizes: list[int] = []
    while sum(sizes) < len(lines):
        sizes.append(min(rng.randint(1, most), len(lines) - sum(sizes)))
    start = 0
    for f, n in enumerate(sizes):
        path = directory / f"split-{f:03d}.json"
        path.write_text("".join(lines[start : start + n]))
        start += n
        at = time.time() - 3600 + f  # a file source reads the oldest file first
        os.utime(path, (at, at))
    return sizes
