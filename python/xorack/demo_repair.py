"""``xorack repair``: repair the dead letters of the demo's resumable job (see
:func:`xorack.demo.repair_demo`).

>>> # xorack demo --records 20000 --workdir /tmp/wc
>>> # xorack repair --records 20000 --workdir /tmp/wc
"""

from __future__ import annotations

from .demo import repair_main as main

__all__ = ["main"]
