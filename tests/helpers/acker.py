"""What the acker-service test modules share (their ``ft`` / ``service`` / ``client`` fixtures are
in conftest.py): a fast retry policy, a small batch, and a standalone ``xorack serve`` started
in a subprocess (stopped by the caller)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from xorack.service import RetryPolicy

PYTHONPATH = str(Path(__file__).resolve().parents[2] / "python")
FAST_RETRY = RetryPolicy(attempts=3, initial_backoff=0.01, max_backoff=0.02, call_timeout=5.0)


def words(n: int, start: int = 0) -> pa.RecordBatch:
    """``n`` rows of (word, n)."""
    return pa.record_batch(
        {"word": [f"w{i}" for i in range(start, start + n)], "n": np.arange(start, start + n)}
    )


def start_serve(*args: str, token_env: str | None = None) -> tuple[subprocess.Popen, str]:
    """``xorack serve --port 0 *args`` in a subprocess (no token or job tokens from this
    environment unless ``token_env``); returns the process and the location it listens on."""
    env = {k: v for k, v in os.environ.items() if k not in ("XORACK_TOKEN", "XORACK_JOB_TOKENS")}
    env["PYTHONPATH"] = PYTHONPATH + os.pathsep + os.environ.get("PYTHONPATH", "")
    if token_env is not None:
        env["XORACK_TOKEN"] = token_env
    proc = subprocess.Popen(
        [sys.executable, "-m", "xorack", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    if "listening on" not in line:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"xorack serve did not start: {line!r} {err}")
    return proc, line.split("listening on ")[1].split()[0]
