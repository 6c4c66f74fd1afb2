"""The acker service over TLS, and the binding rules: a non-loopback address needs a token and
TLS; clients verify the service's certificate (here a self-signed one made at test time)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from conftest import own_address
from xorack import FTLayer, ServiceError
from xorack.service import AckerClient, AckerService, RetryPolicy

U64 = np.uint64
# calls expected to be refused give up fast; calls expected to succeed keep a user's budget (a
# TLS handshake to a service started a moment ago can be refused once on a loaded machine: "tcp
# handshaker shutdown", which the default policy retries)
FAST_RETRY = RetryPolicy(attempts=2, initial_backoff=0.01, max_backoff=0.02, call_timeout=5.0)
SERVING = RetryPolicy(attempts=6, initial_backoff=0.05, max_backoff=0.5, call_timeout=10.0)
PYTHONPATH = str(Path(__file__).resolve().parents[2] / "python")
SERVE = (sys.executable, "-m", "xorack", "serve", "--port", "0", "--rotate-interval", "0")
NO_ADDRESS = "this machine has no non-loopback IPv4 address to bind"


@pytest.fixture
def ft():
    layer = FTLayer(storage="memory", num_buckets=3, max_attempts=3)
    yield layer
    layer.close()


def _roots(tls_files) -> bytes:
    return Path(tls_files[0]).read_bytes()


def test_tls_service_serves_clients_that_trust_its_certificate(ft, tls_files):
    cert, key = tls_files
    with AckerService.embedded(ft, token="s3cret", tls_cert=cert, tls_key=key) as svc:
        assert svc.location.startswith("grpc+tls://127.0.0.1:")
        assert svc.tls_cert_pem == _roots(tls_files)
        roots = _roots(tls_files)
        with AckerClient(svc.location, "s3cret", SERVING, tls_root_certs=roots) as c:
            births = np.array([7, 8], dtype=U64)
            src = c.persist(pa.record_batch({"w": ["a", "b"]}), births=births)
            assert sorted(c.xor(src, births).tolist()) == sorted(src.tolist())
        # the cached client is keyed by its roots too
        assert AckerClient.get(svc.location, token="s3cret", tls_root_certs=roots).ping()


def test_tls_service_refuses_untrusting_plaintext_and_tokenless_clients(ft, tls_files):
    cert, key = tls_files
    with AckerService.embedded(ft, token="s3cret", tls_cert=cert, tls_key=key) as svc:
        plain = svc.location.replace("grpc+tls://", "grpc://")
        # the system's roots do not know a self-signed certificate; plaintext gets no answer
        with pytest.raises(ServiceError, match=r"unreachable.*trust the service's certificate"):
            AckerClient(svc.location, "s3cret", FAST_RETRY).ping()
        with pytest.raises(ServiceError, match="unreachable"):
            AckerClient(plain, "s3cret", FAST_RETRY).ping()
        for token in (None, "guess"):
            with pytest.raises(ServiceError, match="unauthenticated"):
                AckerClient(
                    svc.location, token, FAST_RETRY, tls_root_certs=_roots(tls_files)
                ).ping()


def test_non_loopback_bind_requires_tls_as_well_as_a_token(ft, tls_files):
    with pytest.raises(ServiceError, match=r"non-loopback address '0\.0\.0\.0' without a token"):
        AckerService(ft, "0.0.0.0", 0, tls_cert=tls_files[0], tls_key=tls_files[1])
    with pytest.raises(ServiceError, match=r"non-loopback address '0\.0\.0\.0' without TLS"):
        AckerService(ft, "0.0.0.0", 0, token="s3cret")


def test_tls_arguments_are_checked(ft, tls_files, tmp_path):
    cert, key = tls_files
    with pytest.raises(ServiceError, match="needs both tls_cert and tls_key"):
        AckerService(ft, tls_cert=cert)
    with pytest.raises(ServiceError, match="cannot read the TLS private key"):
        AckerService(ft, tls_cert=cert, tls_key=tmp_path / "missing.key")
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ServiceError, match="is not a PEM file"):
        AckerService(ft, tls_cert=tmp_path / "junk.pem", tls_key=key)
    with pytest.raises(ServiceError, match="not a pair"):
        AckerService(ft, tls_cert=key, tls_key=cert)  # swapped
    with pytest.raises(TypeError, match="PEM bytes"):
        AckerClient("grpc+tls://127.0.0.1:1", tls_root_certs=cert)  # a path, not the bytes
    with pytest.raises(ValueError, match="not a TLS location"):
        AckerClient("grpc://127.0.0.1:1", tls_root_certs=_roots(tls_files))


@pytest.mark.skipif(own_address() is None, reason=NO_ADDRESS)
def test_every_interface_bind_advertises_the_routable_address(ft, tls_files):
    cert, key = tls_files
    address = own_address()
    with AckerService.embedded(
        ft, token="s3cret", host="0.0.0.0", advertise=address, tls_cert=cert, tls_key=key
    ) as svc:
        assert svc.location == f"grpc+tls://{address}:{svc.port}"
        assert AckerClient(svc.location, "s3cret", SERVING, tls_root_certs=_roots(tls_files)).ping()
        with pytest.raises(ServiceError, match="unauthenticated"):
            AckerClient(svc.location, None, FAST_RETRY, tls_root_certs=_roots(tls_files)).ping()


# ---- xorack serve --tls-cert/--tls-key ---------------------------------------------------------


def test_cli_serve_non_loopback_without_tls_is_a_clear_error(capsys, monkeypatch, tls_files):
    from xorack import cli

    monkeypatch.setenv("XORACK_TOKEN", "s3cret")
    for extra, message in (
        ([], "pass --tls-cert and --tls-key"),
        (["--tls-cert", tls_files[0]], "--tls-cert and --tls-key go together"),
    ):
        with pytest.raises(SystemExit) as info:
            cli.main(["serve", "--host", "0.0.0.0", "--port", "0", *extra])
        assert info.value.code == 2
        assert message in capsys.readouterr().err


@pytest.mark.skipif(own_address() is None, reason=NO_ADDRESS)
def test_cli_serve_with_tls_on_every_interface(tls_files):
    env = {**os.environ, "PYTHONPATH": PYTHONPATH + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env["XORACK_TOKEN"] = "t0ken"
    cert, key = tls_files
    proc = subprocess.Popen(
        [*SERVE, "--host", "0.0.0.0", "--tls-cert", cert, "--tls-key", key],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        assert "listening on grpc+tls://" in line, line
        assert "tls=on" in line
        port = line.split("listening on ")[1].split()[0].rsplit(":", 1)[1]
        location = f"grpc+tls://{own_address()}:{port}"
        assert AckerClient(location, "t0ken", SERVING, tls_root_certs=_roots(tls_files)).ping()
        with pytest.raises(ServiceError, match="unauthenticated"):
            AckerClient(location, "wrong", FAST_RETRY, tls_root_certs=_roots(tls_files)).ping()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    assert proc.returncode == 0
