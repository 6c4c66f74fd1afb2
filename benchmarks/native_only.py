"""What every benchmark here measures: the installed xorack with its native extension.

A benchmark imports ``xorack`` the ordinary way (the installed package; an editable install is
the checkout itself) and gives the processes it starts the same package (``child_env``), so a
script cannot time the kernels of another copy. ``fallback_refusal`` is the one-line message a
benchmark stops with when the kernels are the pure-Python fallback, unless told it may measure
them (``--allow-fallback``); the figures then say ``python`` kernels.
"""

from __future__ import annotations

import os
from pathlib import Path


def package_dir() -> Path:
    """The directory of the ``xorack`` package this process imported."""
    import xorack

    return Path(xorack.__file__).resolve().parent


def child_env() -> dict[str, str]:
    """This environment, with ``PYTHONPATH`` leading to the same ``xorack`` (its parent dir
    first), for the client and acker processes a benchmark starts."""
    env = dict(os.environ)
    root = str(package_dir().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def fallback_refusal(backend: str | None, what: str) -> str | None:
    """None when ``backend`` is ``"native"``; else why ``what`` stops (and what to do)."""
    if backend == "native":
        return None
    return (
        f"{what}: the kernels here are the {backend!r} backend, not the native extension "
        f"(xorack from {package_dir()}; XORACK_BACKEND={os.environ.get('XORACK_BACKEND', '')!r})"
        "; install xorack with it (pip install .) and run without PYTHONPATH=python, or pass "
        "--allow-fallback to measure the fallback"
    )
