"""PySpark's Python worker daemon, started the way xorack's tasks need it to start cheaply.

Spark launches ``python -m pyspark.daemon`` with ``pyspark.zip`` and ``py4j-*.zip`` first on
``PYTHONPATH`` (also when pyspark is a pip install that holds the same code unzipped). Two
costs follow, paid by every Python worker the daemon forks, FT ON and OFF alike, and more often
with FT ON (the tagger and a stage run in two workers per task, the event sender in more):

* pyspark is imported from the zip, which keeps no bytecode: every worker compiles pyspark
  from source (about 1.3 s of CPU per worker on the 2-core machine, 2.1 s against 0.8 s);
* every task's ``setup_spark_files`` calls ``importlib.invalidate_caches()``, which re-reads the
  zip's central directory (about 0.1 s per call under load);

and each worker then imports numpy, pandas, pyarrow and xorack itself (0.8 s more), whose
objects the ``gc.collect()`` pyspark runs after every task then traverses again and again.

This module, set as ``spark.python.daemon.module`` (``get_or_create_session`` does it), drops
those two zips from the daemon's path when they belong to the pyspark installed on this
interpreter (the same code, unzipped, with bytecode), imports what every xorack worker needs
once, freezes those objects out of the garbage collector's reach (``gc.freeze``), and runs
pyspark's own daemon: forked workers inherit the imported modules. Any other
setup (a zip from another Spark, no pip pyspark) is left as Spark made it.

Must stay importable without importing pyspark (the path is fixed before pyspark loads):
``import xorack`` loads no pyspark.

>>> import sys
>>> drop_bundled_zips(["/x/site/pyspark/python/lib/pyspark.zip", "/x/site"], "/x/site/pyspark")
['/x/site/pyspark/python/lib/pyspark.zip']
"""

from __future__ import annotations

import gc
import os
import sys

#: Set to "0" to start workers exactly as Spark does (no path change, no pre-import).
ENV_SWITCH = "XORACK_WORKER_DAEMON"


def installed_pyspark(path: list[str]) -> str | None:
    """The directory of the pyspark package found on ``path`` outside any zip, or None."""
    for entry in path:
        if entry.endswith(".zip"):
            continue
        init = os.path.join(entry or ".", "pyspark", "__init__.py")
        if os.path.exists(init):
            return os.path.dirname(os.path.abspath(init))
    return None


def drop_bundled_zips(path: list[str], pyspark_dir: str | None) -> list[str]:
    """The zips of ``path`` that Spark bundles inside the installed pyspark (``pyspark_dir``):
    the same code as that install, so they can be dropped; none when pyspark is not installed
    unzipped (then the zips are the only pyspark there is)."""
    if pyspark_dir is None:
        return []
    inside = os.path.abspath(pyspark_dir) + os.sep
    return [p for p in path if p.endswith(".zip") and os.path.abspath(p).startswith(inside)]


def prepare() -> None:
    """Fix the daemon's path and import the workers' modules (before forking any worker)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return
    dropped = drop_bundled_zips(sys.path, installed_pyspark(sys.path))
    for p in dropped:
        sys.path.remove(p)
        sys.path_importer_cache.pop(p, None)
    if dropped:  # the workers' own subprocesses (if any) see the same path
        kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in kept if p not in dropped)
    # what a worker running xorack's tasks imports anyway, the acker's client included: its
    # modules (pyarrow.flight, gRPC) load here, but no channel exists before a fork (gRPC
    # starts on a client's first call, in the forked worker)
    import pyspark.sql.pandas.serializers
    import pyspark.worker  # noqa: F401

    import xorack.acker
    import xorack.service
    import xorack.spark.stages  # noqa: F401  (numpy, pandas, pyarrow, the kernels)

    # the daemon's objects go to the permanent generation: the gc.collect() a worker runs after
    # every task (pyspark.daemon) skips them (about 50 ms a task under load otherwise), and no
    # collection writes to, hence copies, the pages a forked worker shares with the daemon
    gc.freeze()


def main() -> None:
    """Entry point: ``python -m xorack.worker_daemon`` (what Spark runs)."""
    prepare()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
