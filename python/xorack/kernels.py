"""Backend selection: the C++ extension ``xorack._native`` when importable, else the
pure-Python/numpy fallback ``xorack._fallback``. Both expose the same *raw* API (validated,
contiguous numpy arrays in and out); the checked public API lives in ``acker.py`` and
``hashing.py`` and accepts ``backend=`` to pick one explicitly (tests compare them).

>>> import xorack
>>> xorack.backend in ("native", "python")
True
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

BACKENDS = ("native", "python")
_MODULES = {"native": "xorack._native", "python": "xorack._fallback"}
_cache: dict[str, ModuleType] = {}


def native_available() -> bool:
    """True when the C++ extension was built and imports."""
    try:
        get_impl("native")
    except ImportError:
        return False
    return True


def get_impl(name: str | None = None) -> ModuleType:
    """The raw kernel module for backend ``name`` ("native", "python"; None = the active one)."""
    if name is None:
        name = backend
    if name not in _MODULES:
        raise ValueError(f"unknown backend {name!r}: expected one of {', '.join(BACKENDS)}")
    mod = _cache.get(name)
    if mod is None:
        try:
            mod = importlib.import_module(_MODULES[name])
        except ImportError as exc:
            raise ImportError(
                "the native backend is not available (xorack was installed without its C++ "
                f"extension, or the build failed): {exc}. Use backend='python'."
            ) from exc
        _cache[name] = mod
    return mod


def _select() -> str:
    forced = os.environ.get("XORACK_BACKEND", "").strip().lower()
    if forced:
        if forced not in _MODULES:
            raise ValueError(
                f"XORACK_BACKEND={forced!r} is not a backend: expected one of {', '.join(BACKENDS)}"
            )
        get_impl(forced)  # fail now, loudly, if forced native is missing
        return forced
    try:
        get_impl("native")
    except ImportError:
        return "python"
    return "native"


backend: str = "python"
backend = _select()
