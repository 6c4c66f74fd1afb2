"""A user's job under ``spark-submit`` (PySpark's own script, ``local[1]``): ``--conf
spark.xorack.*`` configures its ``Pipeline(spark)``, and the console stays free of Spark's
ERROR lines and Java stack traces although rows that raise in a native expression fail Spark
tasks (xorack narrows them down to their rows and dead-letters them; tests/helpers/
submit_job.py). The result is checked against plain Spark inside the job."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")

JOB = Path(__file__).resolve().parents[1] / "helpers" / "submit_job.py"
#: The console lines of a failed Spark task: log lines at ERROR, Java stack frames.
NOISE = re.compile(r"^\S+ \S+ ERROR |^\s+at [\w$.]+\(|\"level\": \"ERROR\"")


def _spark_submit() -> str:
    """PySpark's spark-submit next to this interpreter (the venv's), else on PATH."""
    here = Path(sys.executable).parent / "spark-submit"
    found = str(here) if here.exists() else shutil.which("spark-submit")
    if found is None:
        pytest.skip("spark-submit is not installed with this pyspark")
    return found


def test_spark_submit_conf_configures_the_pipeline_and_failed_tasks_stay_quiet(tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    argv = [
        _spark_submit(),
        "--master",
        "local[1]",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.xorack.maxAttempts=1",
        "--conf",
        "spark.xorack.optimistic=false",
        str(JOB),
        str(tmp_path),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {
        "max_attempts": 1,
        "optimistic": False,
        "dead": [0, 7],
        "attempts": [1],
        "lost": 0,
        "matches_plain_spark": True,
    }
    noise = [line for line in (proc.stdout + proc.stderr).splitlines() if NOISE.search(line)]
    assert noise == [], "\n".join(noise[:20])
