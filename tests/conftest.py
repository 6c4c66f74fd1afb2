"""Shared fixtures: kernel backends and one real local Spark session per test run."""

from __future__ import annotations

import os
import sys

import pytest

from helpers.acker import FAST_RETRY
from xorack import FTLayer, kernels
from xorack.service import AckerClient, AckerService

NATIVE_MISSING = "native extension not built (pure-Python install): only the fallback is testable"


def _backend_params() -> list:
    return [
        pytest.param(
            "native",
            marks=pytest.mark.skipif(not kernels.native_available(), reason=NATIVE_MISSING),
        ),
        pytest.param("python"),
    ]


#: The pytest run's exit status, once its session finished (see pytest_unconfigure).
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave with the run's own exit status once pytest has reported everything, without the
    interpreter's teardown. A known defect, not fixed: twice (stops 40 and 43), a whole
    main-suite run that passed then aborted in that teardown with glibc's ``double free or
    corruption (fasttop)`` (exit 134), not reproduced in any smaller run; the process then
    holds the Spark gateway, the acker's gRPC/Arrow Flight threads and the native kernels.
    ``XORACK_TEST_TEARDOWN=1`` runs the teardown as usual (to hunt it)."""
    if not _EXIT_STATUS or os.environ.get("XORACK_TEST_TEARDOWN") == "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS[-1])


#: Groups that run only when ``-m`` names them.
SEPARATE_GROUPS = ("cluster", "driver_crash")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects: a marker added here counts
def pytest_collection_modifyitems(config, items):
    """The cluster group (tests/spark/test_cluster.py) needs a Spark JVM of its own (one
    SparkContext per JVM, and the other tests share a local one); the driver-crash group
    (tests/spark/test_resume.py) starts two or three driver processes per test, each with its own
    Spark (~1 min a test). Each runs only when ``-m`` names it: ``python -m pytest -m cluster``,
    ``-m driver_crash``. Every test that uses the ``spark`` fixture is marked ``spark`` (so
    ``-m "not spark or fallback_smoke"``, CI's pure-Python run, leaves out the others)."""
    for item in items:  # a test on the shared session is a Spark test, marked or not
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
    named = config.getoption("markexpr") or ""
    for group in SEPARATE_GROUPS:
        if group in named:
            continue
        out = [item for item in items if item.get_closest_marker(group) is not None]
        if out:
            config.hook.pytest_deselected(items=out)
            items[:] = [item for item in items if item.get_closest_marker(group) is None]


@pytest.fixture(params=_backend_params())
def backend(request) -> str:
    """Each kernel test runs once per available backend ("native", "python")."""
    return request.param


#: The shared session's JVM collects garbage with the serial collector (a small heap, one
#: test run): G1's concurrent and parallel threads took 27 of its 330 CPU seconds over
#: test_stream_join.py and test_native_ops.py, which ran in 244 s with it against 260-272 s
#: without (stop 45, this 2-core machine). Behaviour does not depend on it;
#: ``XORACK_TEST_JAVA_OPTS`` replaces it (``""``: the JVM's defaults).
_TEST_JVM = {
    "spark.driver.extraJavaOptions": os.environ.get("XORACK_TEST_JAVA_OPTS", "-XX:+UseSerialGC")
}


@pytest.fixture(scope="session")
def spark():
    """One real local Spark session for the whole run: local[2], UI off, few shuffle partitions."""
    pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
    from xorack.spark.session import get_or_create_session

    session = get_or_create_session(app_name="xorack-tests", extra_conf=_TEST_JVM)
    yield session
    session.stop()


@pytest.fixture(scope="session", autouse=True)
def _python_for_spark_workers():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def own_address() -> str | None:
    """This machine's own non-loopback IPv4 address (no packet is sent), or None."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only selects the outgoing interface
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate and its key (PEM paths), valid for localhost, 127.0.0.1, this
    machine's host name and its own address: what a TLS acker on this machine presents."""
    import datetime
    import ipaddress
    import socket

    pytest.importorskip(
        "cryptography", reason="cryptography is not installed: install xorack[test]"
    )
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "xorack test acker")])
    alt: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName(socket.gethostname()),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    if own_address() is not None:
        alt.append(x509.IPAddress(ipaddress.ip_address(own_address())))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_path, key_path = folder / "acker.crt", folder / "acker.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


# ---- an embedded acker over a memory FT layer (the service test modules) ----------------


@pytest.fixture
def ft():
    layer = FTLayer(storage="memory", num_buckets=3, max_attempts=3)
    yield layer
    layer.close()


@pytest.fixture
def service(ft):
    with AckerService.embedded(ft) as svc:
        yield svc


@pytest.fixture
def client(service):
    c = AckerClient(service.location, retry=FAST_RETRY)
    yield c
    c.close()
