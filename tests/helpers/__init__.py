"""Modules the test folders share (``tests/`` is on the import path through conftest.py):
``acker`` (the acker-service tests' retry policy and a standalone ``xorack serve``),
``pipelines`` (the random pipelines of the Spark property tests), ``streams`` (plain Structured
Streaming as the stream tests' oracle), ``crashes`` (a driver crash inside a stream), and the
scripts some tests run as processes of their own by path (``ft_crash_worker.py``,
``resume_driver.py``)."""
