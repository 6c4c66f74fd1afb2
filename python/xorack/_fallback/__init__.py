"""Pure-Python/numpy implementations of the native kernels: the same raw API as
``xorack._native``, file for file with ``cpp/``, bit-for-bit the same results."""

from .ack_table import *  # noqa: F403
from .lineage import *  # noqa: F403
from .partitioners import *  # noqa: F403
from .sharding import *  # noqa: F403
from .spark_hash import *  # noqa: F403
from .timeout_wheel import *  # noqa: F403
