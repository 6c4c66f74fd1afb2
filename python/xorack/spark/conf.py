"""A pipeline's options from Spark configuration: ``spark.xorack.<option>``, the option's name in
camelCase (``max_attempts`` → ``spark.xorack.maxAttempts``), so that ``spark-submit --conf
spark.xorack.maxAttempts=3 job.py`` configures the job's :class:`~xorack.spark.Pipeline`
without a code change. An argument given to ``Pipeline(...)`` wins over the configuration; the
configuration wins over the option's default. An unknown ``spark.xorack.*`` key, or a value
that is not of the option's kind, is a one-line error naming the key.

>>> conf_key("max_attempts"), conf_key("tls_cert"), conf_key("ft")
('spark.xorack.maxAttempts', 'spark.xorack.tlsCert', 'spark.xorack.ft')
>>> parse_value("max_attempts", "3"), parse_value("runaway_share", "none")
(3, None)
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

PREFIX = "spark.xorack."

T = TypeVar("T")


class Unset:
    """The default of a ``Pipeline`` option not given: the configuration's value, else
    ``value``. Its ``repr`` is the default's, so ``help(Pipeline)`` reads as usual."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def default(value: T) -> T:
    """``value`` as the default of an option that Spark configuration may set (typed as the
    value itself, for the signature)."""
    return Unset(value)  # type: ignore[return-value]


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"expected true or false, got {text!r}")
    return lowered == "true"


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def _share(text: str) -> float | None:
    if text.strip().lower() == "none":
        return None
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number in (0, 1] or none, got {text!r}") from None


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError("empty (leave the key unset for the default)")
    return text.strip()


#: Each option Spark configuration can set, with the parser of its value (every
#: ``Pipeline`` option but the session itself; tests/spark/test_conf.py keeps them in step).
PARSERS: dict[str, Callable[[str], Any]] = {
    "ft": _bool,
    "storage": _text,
    "max_attempts": _int,
    "deterministic_ids": _bool,
    "service": _text,
    "token": _text,
    "id_salt": _int,
    "workdir": _text,
    "runaway_share": _share,
    "job": _text,
    "acker_host": _text,
    "acker_advertise": _text,
    "tls_cert": _text,
    "tls_key": _text,
    "combine": _bool,
    "chunk_records": _int,
    "ackers": _int,
    "resume": _bool,
    "optimistic": _bool,
    "verbose": _bool,
}


def conf_key(option: str) -> str:
    """The Spark configuration key of a ``Pipeline`` option."""
    head, *rest = option.split("_")
    return PREFIX + head + "".join(word.capitalize() for word in rest)


_OPTIONS = {conf_key(option): option for option in PARSERS}


def parse_value(option: str, text: str) -> Any:
    """The value of ``option`` written as ``text`` in Spark configuration; a ``ValueError``
    names the key."""
    try:
        return PARSERS[option](text)
    except ValueError as exc:
        raise ValueError(f"Spark configuration {conf_key(option)}={text!r}: {exc}") from None


def xorack_conf(spark: Any) -> dict[str, str]:
    """The ``spark.xorack.*`` entries of the session's configuration (the runtime's, which
    holds ``--conf`` and builder settings too); none when the session cannot list them."""
    fast = _xorack_entries_in_jvm(spark)
    if fast is not None:
        return fast
    try:
        entries = spark.conf.getAll
    except Exception:  # not a session (or one without a listable configuration)
        return {}
    if callable(entries):
        entries = entries()
    return {k: str(v) for k, v in dict(entries).items() if k.startswith(PREFIX)}


def _xorack_entries_in_jvm(spark: Any) -> dict[str, str] | None:
    """The ``spark.xorack.*`` entries read in two py4j calls and one per entry (PySpark's
    ``conf.getAll`` makes two per entry of the whole configuration: ~50 ms a pipeline); None
    where the session has no JVM (Spark Connect) or the keys cannot be listed so."""
    try:
        jconf = spark.conf._jconf
        jvm = spark.sparkContext._jvm
        keys = str(jvm.java.lang.String.join("\n", jconf.getAllAsJava().keySet()))
        return {k: str(jconf.get(k)) for k in keys.split("\n") if k.startswith(PREFIX)}
    except Exception:  # no JVM here, or a key the join garbled: list them the slow way
        return None


def resolve(spark: Any, given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The options of a pipeline: ``given`` (the constructor's arguments, :class:`Unset` where
    not given) completed from the session's ``spark.xorack.*`` configuration, else the defaults.
    Returns the options and the configuration entries that set some of them (key → text)."""
    entries = xorack_conf(spark)
    unknown = sorted(k for k in entries if k not in _OPTIONS)
    if unknown:
        key = unknown[0]
        near = difflib.get_close_matches(key, list(_OPTIONS), n=1)
        hint = f"did you mean {near[0]}?" if near else f"the keys are {', '.join(_OPTIONS)}"
        raise ValueError(f"unknown Spark configuration key {key} for xorack ({hint})")
    options: dict[str, Any] = {}
    used: dict[str, str] = {}
    for option, value in given.items():
        if not isinstance(value, Unset):
            options[option] = value
            continue
        key = conf_key(option)
        if key in entries:
            options[option] = parse_value(option, entries[key])
            used[key] = entries[key]
        else:
            options[option] = value.value
    return options, used


def name_the_key(message: str, used: Mapping[str, str]) -> str:
    """``message`` (a check of the options failed) with the configuration entries it is about
    (those whose option it names, else every entry that set an option)."""
    if not used:
        return message
    named = {k: v for k, v in used.items() if re.search(rf"\b{_OPTIONS[k]}\b", message)}
    named = named or dict(used)
    said = ", ".join(f"{k}={v!r}" for k, v in named.items())
    return f"{message} (from Spark configuration {said})"


__all__ = ["PARSERS", "PREFIX", "Unset", "conf_key", "default", "parse_value", "resolve"]
