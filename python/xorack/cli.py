"""The ``xorack`` command (also ``python -m xorack``): ``demo``, ``serve``, ``bench``.

Each subcommand imports what it needs only when it runs, so ``xorack serve`` never imports Spark.

>>> from xorack.cli import build_parser
>>> args = build_parser().parse_args(["serve", "--port", "0"])
>>> args.command, args.host, args.port
('serve', '127.0.0.1', 0)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from . import __version__

_DELEGATED = {
    "demo": ("xorack.demo", "run the reference pipeline on local Spark with failures injected"),
    "bench": ("xorack.bench", "run the benchmarks and print the comparison report"),
    "repair": ("xorack.demo_repair", "repair the dead letters of a demo job (--workdir)"),
}


class CommandParser(argparse.ArgumentParser):
    """The argument parser of every ``xorack`` command: a bad option is one line on stderr that
    names it, and exit status 2, before anything starts (no usage block, no traceback).

    >>> p = CommandParser(prog="xorack demo")
    >>> _ = p.add_argument("--records", type=positive_int, default=1)
    >>> import contextlib, io
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err):
    ...     try:
    ...         p.parse_args(["--records", "0"])
    ...     except SystemExit as exc:
    ...         print(exc.code)
    2
    >>> print(err.getvalue(), end="")
    xorack demo: error: argument --records: must be >= 1, got 0 (see 'xorack demo --help')
    """

    def error(self, message: str) -> NoReturn:
        one_line = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {one_line} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``xorack`` command."""
    parser = CommandParser(
        prog="xorack",
        description="Record-level fault tolerance for PySpark with an XOR acker.",
        epilog="Run 'xorack <command> --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"xorack {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{demo,serve,bench,repair}", required=True)

    for name, (_module, text) in _DELEGATED.items():
        # Options are parsed by the command itself ('xorack demo --help' shows them).
        sub.add_parser(name, help=text, description=text, add_help=False)

    serve = sub.add_parser(
        "serve",
        help="run the acker service (an Arrow Flight server hosting one FT layer)",
        description=(
            "Run the acker service standalone, so that several Spark jobs can report to one "
            "acker. Prints 'xorack acker listening on grpc://HOST:PORT' once it accepts calls; "
            "stops cleanly on SIGINT/SIGTERM (the FT layer is closed, durable storage flushed)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.set_defaults(command_parser=serve)  # errors found after parsing say "xorack serve"
    serve.add_argument(
        "--host",
        type=_host,
        default="127.0.0.1",
        help="address to listen on; a non-loopback address requires --token and "
        "--tls-cert/--tls-key",
    )
    serve.add_argument(
        "--port", type=_port, default=8815, help="TCP port to listen on (0 = any free port)"
    )
    serve.add_argument(
        "--storage",
        type=storage_spec,
        default="memory",
        help="where records are persisted: 'memory' (lost with the process) or a SQLite file "
        f"(durable: unfinished records are replayed after a restart), {STORAGE_FORMS}",
    )
    serve.add_argument(
        "--num-buckets",
        type=positive_int,
        default=3,
        help="timeout buckets: a record times out between (N-1)/N*T and T after its last "
        "persist/touch, T = N * rotate interval",
    )
    serve.add_argument(
        "--max-attempts",
        type=positive_int,
        default=5,
        help="attempts per source record before it goes to the dead-letter table",
    )
    serve.add_argument(
        "--default-partitions",
        type=positive_int,
        default=200,
        help="partitions of the default replay partitioner (hash of the stored key hash); "
        "match the job's spark.sql.shuffle.partitions / repartition count",
    )
    serve.add_argument(
        "--replay-partitioner",
        action="append",
        default=[],
        metavar="SOURCE=SPEC",
        type=_partitioner_arg,
        help="replay partitioner of one source index (repeatable), SPEC one of hash:N, "
        "roundrobin:N[:START], forward[:N], single, broadcast:N, shuffle:N[:SEED]; "
        "e.g. --replay-partitioner 0=hash:8",
    )
    serve.add_argument(
        "--rotate-interval",
        type=non_negative_float,
        default=10.0,
        help="seconds between timeout rotations (0 = never rotate on a timer; clients call rotate)",
    )
    serve.add_argument(
        "--max-request-mb",
        type=positive_int,
        default=256,
        help="largest request (the Arrow data of one persist/xor/fail call) in MiB; a bigger "
        "one is refused before it is read (keep it well below the acker's memory)",
    )
    serve.add_argument(
        "--max-request-rows",
        type=positive_int,
        default=1 << 20,
        help="most rows of one request: each pending record costs the acker ~150-250 bytes "
        "however small its payload",
    )
    serve.add_argument(
        "--max-jobs",
        type=positive_int,
        default=256,
        help="jobs served at once: each job (one pipeline run, AckerClient.get(..., job=NAME)) "
        "gets its own FT layer on its first call, with its own records, replays, dead letters "
        "and stats (with sqlite storage in PATH.jobs/NAME.db, durable across restarts)",
    )
    serve.add_argument(
        "--job-idle-seconds",
        type=non_negative_float,
        default=3600.0,
        help="when --max-jobs are served and a new job comes, the jobs with nothing pending "
        "and no call for this long are closed to make room",
    )
    serve.add_argument(
        "--job-token",
        action="append",
        default=argparse.SUPPRESS,  # never show a token in --help
        metavar="JOB=TOKEN",
        help="a credential of one job's own (repeatable): its calls must present TOKEN, and "
        "no other token opens it. Prefer XORACK_JOB_TOKENS='JOB=TOKEN,...' (used when no "
        "--job-token is given): command lines are visible to other users",
    )
    serve.add_argument(
        "--token",
        default=argparse.SUPPRESS,  # never show a token in --help
        help="shared secret every call must present; required for a non-loopback --host. "
        "Prefer the XORACK_TOKEN environment variable (used when --token is not given): "
        "command lines are visible to other users",
    )
    serve.add_argument(
        "--tls-cert",
        metavar="PEM",
        default=None,
        help="serve TLS (grpc+tls://) with this certificate (chain) file; required, with "
        "--tls-key, for a non-loopback --host. Clients trust it through "
        "AckerClient.get(..., tls_root_certs=<its PEM bytes or its CA's>)",
    )
    serve.add_argument(
        "--tls-key", metavar="PEM", default=None, help="the private key of --tls-cert"
    )
    serve.add_argument(
        "--shards",
        type=_shard_count,
        default=1,
        help="run N acker processes, each owning the source ids that hash to it, with its own "
        "storage (a SQLite file per shard: NAME.shard0ofN.db; memory stays memory); shard K "
        "listens on --port + K (0: free ports). Prints one location naming every shard, "
        "'grpc://HOST:P0,grpc://HOST:P1,...': give that whole string to clients and "
        "Pipeline(service=...). A shard process that dies is restarted on its port with its "
        "storage",
    )
    serve.add_argument(
        "--shard",
        type=_shard,
        default=None,
        metavar="K/N",
        help="serve as shard K of N of a sharded acker (what --shards starts in each process; "
        "--storage is then this shard's own)",
    )
    serve.add_argument(
        "--job",
        default=None,
        metavar="NAME",
        help="the job served on --storage itself (others get PATH.jobs/JOB.db); default: the "
        "job 'default'",
    )
    serve.add_argument(
        "--advertise",
        default=None,
        metavar="HOST",
        help="the host name put in the printed location (the name clients route to); "
        "default: --host",
    )
    serve.add_argument(
        "--lifeline",
        action="store_true",
        help="shut down when stdin reaches EOF: the process that started this one (a sharded "
        "acker's supervisor, which keeps a pipe open to each shard) has ended",
    )
    return parser


def _shard_count(text: str) -> int:
    from .sharding import MAX_SHARDS

    value = positive_int(text)
    if value > MAX_SHARDS:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_SHARDS}, got {value}")
    return value


def _shard(text: str) -> Any:
    from .sharding import Shard

    try:
        return Shard.parse(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _partitioner_arg(text: str) -> tuple[int, str]:
    source, sep, spec = text.partition("=")
    if not sep or not spec:
        raise argparse.ArgumentTypeError(f"expected SOURCE=SPEC (e.g. 0=hash:8), got {text!r}")
    index = _int(source)
    if index < 0:
        raise argparse.ArgumentTypeError(f"the source index must be >= 0, got {index}")
    from .replay import replay_partitioner_from_spec

    try:
        replay_partitioner_from_spec(spec)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return index, spec


# ---- option types shared by the commands (an ArgumentTypeError names the option) ------------

#: How a storage option is written, for help texts.
STORAGE_FORMS = (
    "'sqlite:///relative/path.db' or 'sqlite:////absolute/path.db' (SQLAlchemy's rule: a "
    "fourth slash makes the path absolute) or a plain file path such as /var/lib/ft.db"
)


def _host(text: str) -> str:
    import socket

    if not text.strip():
        raise argparse.ArgumentTypeError("the host is empty (e.g. 127.0.0.1 or 0.0.0.0)")
    try:
        socket.getaddrinfo(text, None)
    except (OSError, UnicodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot resolve host {text!r}: {exc}") from None
    return text


def _port(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in [0, 65535], got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    value = _float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (a duration in seconds).

    >>> positive_float("0.5")
    0.5
    """
    value = _float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def rate(text: str) -> float:
    """A share in [0, 1]."""
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


#: The Spark master URLs Spark itself accepts (``SparkContext.createTaskScheduler``), as
#: (pattern, what it is); k8s:// takes any API server URL.
_MASTER_FORMS = (
    (r"local", "local"),
    (r"local\[(?P<threads>[0-9]+|\*)\]", "local[N] or local[*]"),
    (r"local\[(?P<threads>[0-9]+|\*)\s*,\s*(?P<failures>[0-9]+)\]", "local[N,F]"),
    (
        r"local-cluster\[\s*(?P<workers>[0-9]+)\s*,\s*(?P<cores>[0-9]+)\s*,"
        r"\s*(?P<memory>[0-9]+)\s*\]",
        "local-cluster[N,C,M]",
    ),
    (r"spark://(?P<hosts>.+)", "spark://HOST:PORT[,HOST:PORT...]"),
    (r"yarn", "yarn"),
    (r"k8s://(?P<api>.+)", "k8s://API-SERVER"),
)
MASTER_FORMS = ", ".join(form for _pattern, form in _MASTER_FORMS)
#: The executors' memory on local-cluster (``get_or_create_session``): a worker needs as much.
LOCAL_CLUSTER_EXECUTOR_MB = 512


def spark_master(text: str) -> str:
    """A Spark master URL in one of the forms Spark accepts (checked here, so that a typo is an
    option error rather than a JVM stack trace after Spark starts).

    >>> spark_master("local[2,2]"), spark_master("spark://a:7077,b:7077")
    ('local[2,2]', 'spark://a:7077,b:7077')
    >>> spark_master("bogus://x")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: not a Spark master URL: 'bogus://x' (expected local, ...)
    """
    import re

    for pattern, form in _MASTER_FORMS:
        match = re.fullmatch(pattern, text)
        if match is None:
            continue
        parts = match.groupdict()
        for name in ("threads", "workers", "cores", "memory"):
            if parts.get(name) not in (None, "*") and int(parts[name]) < 1:
                raise argparse.ArgumentTypeError(f"{form}: {name} must be >= 1, got {text!r}")
        if parts.get("memory") is not None and int(parts["memory"]) < LOCAL_CLUSTER_EXECUTOR_MB:
            raise argparse.ArgumentTypeError(
                f"{text!r}: M (MiB per worker) must be >= {LOCAL_CLUSTER_EXECUTOR_MB}, the "
                "memory of each executor (e.g. local-cluster[2,1,1024])"
            )
        for address in (parts.get("hosts") or "").split(",") if parts.get("hosts") else ():
            host, sep, port = address.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
                raise argparse.ArgumentTypeError(
                    f"expected spark://HOST:PORT (e.g. spark://master:7077), got {text!r}"
                )
        return text
    raise argparse.ArgumentTypeError(f"not a Spark master URL: {text!r} (expected {MASTER_FORMS})")


def storage_spec(text: str) -> str:
    """A storage spec that :func:`xorack.storage.open_storage` understands (not opened here)."""
    from .storage import storage_path

    try:
        storage_path(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def check_storage_opens(parser: argparse.ArgumentParser, option: str, spec: str) -> None:
    """Open and close the storage ``spec`` once, so that a file that cannot be used (a missing
    directory, not a database, locked by another FT layer) is an option error before a job
    starts. Creates the SQLite file, as the job would."""
    from .errors import XorackError
    from .storage import open_storage

    try:
        open_storage(spec).close()
    except (XorackError, OSError, ValueError) as exc:
        parser.error(f"argument {option}: {exc}")


def job_storage(spec: str, job: str) -> str:
    """The storage spec of ``job``'s FT layer on an acker started with storage ``spec``: the
    job ``"default"`` uses ``spec`` itself; with ``sqlite:///PATH`` another job uses
    ``PATH.jobs/JOB.db`` (so a restarted acker finds each job's unfinished records again).

    >>> job_storage("sqlite:///data/acker.db", "run-7"), job_storage("memory", "run-7")
    ('sqlite:///data/acker.db.jobs/run-7.db', 'memory')
    """
    from .service import DEFAULT_JOB, check_job

    job = check_job(job)  # no path separator can reach the file name
    if job == DEFAULT_JOB or not spec.startswith("sqlite:///"):
        return spec
    return f"sqlite:///{spec[len('sqlite:///') :]}.jobs/{job}.db"


def _job_tokens(given: list[str] | str) -> dict[str, str]:
    """``{job: token}`` from ``--job-token JOB=TOKEN`` options or ``'JOB=TOKEN,...'``."""
    from .service import check_job, check_token

    items = given.split(",") if isinstance(given, str) else given
    out: dict[str, str] = {}
    for item in (i.strip() for i in items):
        if not item:
            continue
        job, sep, token = item.partition("=")
        if not sep or not token:
            raise ValueError("expected JOB=TOKEN (e.g. nightly-run=s3cret)")
        out[check_job(job)] = check_token(token) or ""
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``xorack`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] in _DELEGATED:
        return _delegate(argv[0], argv[1:], parser)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args, args.command_parser)
    parser.error(f"unknown command {args.command!r}")  # unreachable: argparse checks choices
    return 2


def _delegate(name: str, rest: list[str], parser: argparse.ArgumentParser) -> int:
    module_name, _text = _DELEGATED[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        parser.exit(2, f"xorack {name} is not available: {exc}\n")
    result: Any = module.main(rest)
    return int(result or 0)


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run the acker service until SIGINT/SIGTERM; returns 0 after a clean shutdown."""
    from .errors import ServiceError, XorackError
    from .ftlayer import FTLayer
    from .service import DEFAULT_JOB, AckerService, check_job, check_token, is_loopback

    token = getattr(args, "token", None) or os.environ.get("XORACK_TOKEN") or None
    try:
        token = check_token(token)
    except ValueError as exc:
        where = "--token" if getattr(args, "token", None) else "XORACK_TOKEN"
        print(f"xorack serve: error: {where}: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(args.host) and not token:
        msg = (
            f"--host {args.host} is not a loopback address: pass --token (or set XORACK_TOKEN) "
            "so that only your jobs can report to this acker"
        )
        if parser is not None:
            parser.error(msg)
        raise ServiceError(msg)
    tls_cert, tls_key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    if (tls_cert is None) != (tls_key is None) or (not is_loopback(args.host) and not tls_cert):
        msg = (
            "--tls-cert and --tls-key go together"
            if (tls_cert is None) != (tls_key is None)
            else f"--host {args.host} is not a loopback address: pass --tls-cert and --tls-key "
            "(PEM files) so that the token and the records are encrypted on the network"
        )
        if parser is not None:
            parser.error(msg)
        raise ServiceError(msg)
    try:
        job_tokens = _job_tokens(
            getattr(args, "job_token", None) or os.environ.get("XORACK_JOB_TOKENS", "")
        )
    except ValueError as exc:
        print(f"xorack serve: error: --job-token: {exc}", file=sys.stderr)
        return 2

    main_job = getattr(args, "job", None) or DEFAULT_JOB
    try:
        main_job = check_job(main_job)
    except ValueError as exc:
        print(f"xorack serve: error: --job: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "shards", 1) > 1:
        if getattr(args, "shard", None) is not None:
            msg = "--shards N starts the shards; --shard K/N is what each of them is given"
            if parser is not None:
                parser.error(msg)
            raise ServiceError(msg)
        if parser is not None and args.storage != "memory":
            from .sharding import Shard, shard_storage

            for k in range(args.shards):  # each shard process opens its own file
                spec = shard_storage(args.storage, Shard(k, args.shards))
                check_storage_opens(parser, "--storage", spec)
        return _serve_shards(args, token)

    def make_ft(job: str = main_job) -> FTLayer:
        storage = args.storage if job == main_job else job_storage(args.storage, job)
        if storage != args.storage:
            os.makedirs(os.path.dirname(storage[len("sqlite:///") :]), exist_ok=True)
        ft = FTLayer(
            storage=storage,
            num_buckets=args.num_buckets,
            max_attempts=args.max_attempts,
            replay_partitioners=dict(args.replay_partitioner) or None,
            default_partitions=args.default_partitions,
            shard=getattr(args, "shard", None),
        )
        if job != main_job and args.rotate_interval > 0:
            ft.start(args.rotate_interval)
        return ft

    try:
        ft = make_ft()
    except Exception as exc:  # one line, never a traceback: what is wrong and with what
        text = " ".join(str(exc).split()) or type(exc).__name__
        if not isinstance(exc, (XorackError, ValueError, TypeError, OSError)):
            text = f"{type(exc).__name__}: {text}"
        if parser is not None:  # the storage is opened before the service starts
            parser.error(f"argument --storage: {text}")
        print(f"xorack serve: error: cannot open the FT layer: {text}", file=sys.stderr)
        return 2
    for note in getattr(ft.storage, "quarantine_notes", ()):
        print(f"xorack serve: warning: corrupt storage, quarantined {note}", file=sys.stderr)
    try:
        service = AckerService(
            ft,
            args.host,
            args.port,
            token=token,
            job=main_job,
            advertise=getattr(args, "advertise", None),
            ft_factory=make_ft,
            job_tokens=job_tokens,
            max_jobs=getattr(args, "max_jobs", 256),
            job_idle_seconds=getattr(args, "job_idle_seconds", 3600.0),
            max_request_bytes=getattr(args, "max_request_mb", 256) << 20,
            max_request_rows=getattr(args, "max_request_rows", 1 << 20),
            close_ft=True,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
    except ServiceError as exc:
        ft.close()
        print(f"xorack serve: error: {exc}", file=sys.stderr)
        return 1
    except BaseException:
        ft.close()
        raise
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if args.rotate_interval > 0:
            ft.start(args.rotate_interval)
        service.start()
        shard = getattr(args, "shard", None)
        print(
            f"xorack acker listening on {service.location} (storage={args.storage}, "
            f"pending={ft.pending}, auth={'token' if token else 'none'}, "
            f"tls={'on' if tls_cert else 'off'}"
            f"{f', shard {shard}' if shard is not None else ''})",
            flush=True,
        )
        if getattr(args, "lifeline", False):  # started by a ShardedAcker: end with it
            threading.Thread(target=_lifeline, args=(stop,), daemon=True).start()
        while not stop.wait(0.5):
            pass
        print("xorack acker: shutting down", flush=True)
    finally:
        service.shutdown()  # stops the rotation thread and closes the FT layer
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0


def _lifeline(stop: threading.Event) -> None:
    """Set ``stop`` when stdin reaches EOF: the process that started this one has ended (or
    closed the pipe to stop it)."""
    with contextlib.suppress(OSError, ValueError):
        while sys.stdin.buffer.read(4096):
            pass
    stop.set()


def _serve_args(args: argparse.Namespace) -> list[str]:
    """The ``xorack serve`` options every shard of ``--shards`` gets (besides its shard, port,
    storage, host, job, advertise and TLS files; the token travels in the environment)."""
    out = [
        "--num-buckets",
        str(args.num_buckets),
        "--max-attempts",
        str(args.max_attempts),
        "--default-partitions",
        str(args.default_partitions),
        "--rotate-interval",
        repr(float(args.rotate_interval)),
        "--max-request-mb",
        str(getattr(args, "max_request_mb", 256)),
        "--max-request-rows",
        str(getattr(args, "max_request_rows", 1 << 20)),
        "--max-jobs",
        str(getattr(args, "max_jobs", 256)),
        "--job-idle-seconds",
        repr(float(getattr(args, "job_idle_seconds", 3600.0))),
    ]
    for source, spec in args.replay_partitioner:
        out += ["--replay-partitioner", f"{source}={spec}"]
    return out


def _serve_shards(args: argparse.Namespace, token: str | None) -> int:
    """``xorack serve --shards N``: start the N shard processes, print the location naming
    them all, and stop them on SIGINT/SIGTERM."""
    from .errors import ServiceError
    from .shards import ShardedAcker

    job_tokens = getattr(args, "job_token", None)
    # the shards read job tokens from their environment, never their command line
    env = {"XORACK_JOB_TOKENS": ",".join(job_tokens)} if job_tokens else None
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            acker = ShardedAcker(
                args.shards,
                storage=args.storage,
                job=getattr(args, "job", None),
                host=args.host,
                port=args.port,
                advertise=getattr(args, "advertise", None),
                token=token,
                tls_cert=getattr(args, "tls_cert", None),
                tls_key=getattr(args, "tls_key", None),
                serve_args=_serve_args(args),
                env=env,
            )
        except ServiceError as exc:
            print(f"xorack serve: error: {exc}", file=sys.stderr)
            return 1
        try:
            print(
                f"xorack acker listening on {acker.location} ({args.shards} shards, "
                f"storage={args.storage}, auth={'token' if token else 'none'}, "
                f"tls={'on' if getattr(args, 'tls_cert', None) else 'off'})",
                flush=True,
            )
            if getattr(args, "lifeline", False):
                threading.Thread(target=_lifeline, args=(stop,), daemon=True).start()
            acker.wait(stop)
            print("xorack acker: shutting down", flush=True)
        finally:
            acker.close()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
