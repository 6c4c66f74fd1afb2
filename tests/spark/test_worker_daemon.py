"""xorack.worker_daemon: Python workers import pyspark from the installed package (not Spark's
bundled zip, which holds no bytecode and is re-read by every task) and inherit xorack's modules
from the daemon."""

from __future__ import annotations

import os

from xorack.worker_daemon import drop_bundled_zips, installed_pyspark


def test_only_the_zips_inside_the_installed_pyspark_are_dropped(tmp_path):
    site = tmp_path / "site"
    (site / "pyspark" / "python" / "lib").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    bundled = str(site / "pyspark" / "python" / "lib" / "pyspark.zip")
    py4j = str(site / "pyspark" / "python" / "lib" / "py4j-0.10.9.9-src.zip")
    other = str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip")
    path = [bundled, py4j, other, str(site)]
    found = installed_pyspark(path)
    assert found == str(site / "pyspark")
    assert drop_bundled_zips(path, found) == [bundled, py4j]


def test_nothing_is_dropped_when_pyspark_exists_only_zipped(tmp_path):
    path = [str(tmp_path / "spark" / "python" / "lib" / "pyspark.zip"), str(tmp_path)]
    assert installed_pyspark(path) is None
    assert drop_bundled_zips(path, None) == []


def test_workers_run_the_installed_pyspark_with_xorack_already_imported(spark):
    def worker_view(rows):  # a closure: pickled by value (the workers cannot import tests/)
        import gc
        import sys

        import pyspark

        for _ in rows:
            pass
        yield (pyspark.__file__, "xorack.spark.stages" in sys.modules, gc.get_freeze_count() > 0)

    seen = set(spark.sparkContext.parallelize(range(4), 2).mapPartitions(worker_view).collect())
    assert len(seen) == 1, seen
    pyspark_file, preloaded, frozen = seen.pop()
    assert ".zip" + os.sep not in pyspark_file, pyspark_file
    assert preloaded  # inherited from the daemon: no import when a task unpickles a stage
    assert frozen  # the per-task gc.collect() skips the daemon's objects
