"""Both kernel backends implement one raw API (``xorack/_kernel_api.py``): the same names and
the same positional parameters, in the built extension, its stub ``_native.pyi`` and the numpy
fallback. (mypy checks the stub and the fallback against the protocol statically.)"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import xorack
from xorack import _kernel_api as api
from xorack import kernels

NATIVE_MISSING = "native extension not built (pure-Python install): only the fallback is testable"
STUB = Path(xorack.__file__).with_name("_native.pyi")


def _public(module) -> set[str]:
    return {
        n for n in dir(module) if not n.startswith("_") and not inspect.ismodule(getattr(module, n))
    }


def _python_arity(fn) -> tuple[int, int]:
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]
    return sum(p.default is p.empty for p in params), len(params)


def _pybind_arity(fn) -> tuple[int, int]:
    """(required, total) positional parameters from pybind11's signature line."""
    first = (fn.__doc__ or "").strip().splitlines()[0]
    inside = first[first.index("(") + 1 : first.rindex(") ->")]
    # split at top-level commas (types hold brackets)
    parts, depth, cur = [], 0, ""
    for ch in inside:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    parts = [p for p in parts if not re.match(r"self\s*:", p)]
    return sum("=" not in p for p in parts), len(parts)


def test_the_fallback_has_exactly_the_protocol_api():
    impl = kernels.get_impl("python")
    assert _public(impl) == set(api.KERNEL_FUNCTIONS) | set(api.KERNEL_CLASSES), (
        "a kernel was added or removed: update xorack/_kernel_api.py, _native.pyi and both backends"
    )
    for name, arity in api.KERNEL_FUNCTIONS.items():
        assert _python_arity(getattr(impl, name)) == arity, name
    for cls, methods in api.KERNEL_CLASSES.items():
        for method, count in methods.items():
            assert _python_arity(getattr(getattr(impl, cls), method))[1] == count, f"{cls}.{method}"


@pytest.mark.skipif(not kernels.native_available(), reason=NATIVE_MISSING)
def test_the_extension_has_exactly_the_protocol_api():
    impl = kernels.get_impl("native")
    expected = set(api.KERNEL_FUNCTIONS) | set(api.KERNEL_CLASSES) | api.NATIVE_ONLY
    assert _public(impl) == expected, (
        "a kernel was added or removed: update xorack/_kernel_api.py, _native.pyi and both backends"
    )
    for name, arity in api.KERNEL_FUNCTIONS.items():
        assert _pybind_arity(getattr(impl, name)) == arity, name
    for cls, methods in api.KERNEL_CLASSES.items():
        for method, count in methods.items():
            assert _pybind_arity(getattr(getattr(impl, cls), method))[1] == count, f"{cls}.{method}"


def _stub_api() -> dict[str, object]:
    tree = ast.parse(STUB.read_text())
    out: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = len(node.args.posonlyargs) + len(node.args.args)
        elif isinstance(node, ast.ClassDef):
            out[node.name] = {
                f.name: len(f.args.posonlyargs) + len(f.args.args) - (f.name != "restore")
                for f in node.body
                if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")
            }
    return out


def test_the_stub_matches_the_protocol():
    stub = _stub_api()
    functions = {k: v for k, v in stub.items() if not isinstance(v, dict)}
    assert set(functions) == set(api.KERNEL_FUNCTIONS) | api.NATIVE_ONLY
    for name, (_required, total) in api.KERNEL_FUNCTIONS.items():
        assert functions[name] == total, name
    for cls, methods in api.KERNEL_CLASSES.items():
        stub_methods = stub[cls]
        assert isinstance(stub_methods, dict)
        for method, count in methods.items():
            assert stub_methods[method] == count, f"{cls}.{method}"
