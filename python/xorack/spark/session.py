"""A local Spark session set up the way xorack needs it."""

from __future__ import annotations

import os
import sys
from typing import Any

from ..worker_daemon import ENV_SWITCH as WORKER_DAEMON_SWITCH


def get_or_create_session(
    master: str = "local[2,2]",
    app_name: str = "xorack",
    shuffle_partitions: int = 4,
    extra_conf: dict[str, Any] | None = None,
):
    """A SparkSession whose Python workers run this interpreter (PYSPARK_PYTHON), UI off.

    The default master ``local[2,2]`` retries a failed task once (plain ``local[2]`` never
    retries), so a Python worker that dies mid-task is recovered by Spark, as on a cluster.
    Any master URL works: ``local-cluster[2,1,1024]`` starts two executor JVMs on this machine
    (each executor gets 512m unless ``extra_conf`` sets ``spark.executor.memory``: it must stay
    below the worker's 1024 MB); on a real cluster (``spark://``, ``yarn``, ``k8s://``) the
    driver is not pinned to 127.0.0.1 and the executors need xorack installed in the same
    Python. Python workers start from :mod:`xorack.worker_daemon` (pyspark from the installed
    package rather than Spark's bundled zip, the workers' modules imported once before the
    daemon forks); ``XORACK_WORKER_DAEMON=0`` starts them as plain Spark does.

    >>> spark = get_or_create_session()  # doctest: +SKIP
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    _export_package_path()
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    if master.startswith("local"):  # everything on this machine: keep the driver on loopback
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    if master.startswith("local-cluster"):
        builder = builder.config("spark.executor.memory", "512m")
    if os.environ.get(WORKER_DAEMON_SWITCH, "1") != "0":  # see xorack.worker_daemon
        builder = builder.config("spark.python.daemon.module", "xorack.worker_daemon")
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, str(value))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _export_package_path() -> None:
    """Make this xorack importable in Spark's Python workers (they inherit PYTHONPATH), also
    when it runs from a source tree rather than an installed package."""
    import xorack

    root = os.path.dirname(os.path.dirname(os.path.abspath(xorack.__file__)))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
