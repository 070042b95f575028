"""Redis over TLS (`rediss://`): the intake, a worker and beat all work through a Redis that
speaks only TLS, with its certificate checked against our CA.

The embedded Valkey is built without TLS; this test uses the machine's `redis-server`
(Debian's is built with TLS), and a CA and certificate made here with `openssl`."""

from __future__ import annotations

import shutil
import subprocess
import urllib.parse
from pathlib import Path

import pytest
import redis

from app.config.redis import make_redis
from tests.support.processes import free_port, wait_for
from tests.support.services import require

# HTTP, Redis or the browser: the journal's database plays no part.
pytestmark = pytest.mark.journal_independent

REDIS_SERVER = shutil.which("redis-server")
OPENSSL = shutil.which("openssl")


def make_certificates(directory: Path) -> dict[str, Path]:
    """A CA, and a certificate for 127.0.0.1 signed by it."""
    assert OPENSSL is not None
    paths = {name: directory / f"{name}.pem" for name in ("ca", "ca-key", "cert", "key", "csr")}
    run = [OPENSSL, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
    subprocess.run(
        [*run, "-subj", "/CN=test-ca", "-keyout", paths["ca-key"], "-out", paths["ca"]],
        check=True,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(
        [
            *(OPENSSL, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1"),
            *("-keyout", str(paths["key"]), "-out", str(paths["csr"])),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    extensions = directory / "san.cnf"
    extensions.write_text("subjectAltName=IP:127.0.0.1\n")
    subprocess.run(
        [
            *(OPENSSL, "x509", "-req", "-in", str(paths["csr"]), "-CA", str(paths["ca"])),
            *("-CAkey", str(paths["ca-key"]), "-CAcreateserial", "-days", "2"),
            *("-extfile", str(extensions), "-out", str(paths["cert"])),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return paths


@pytest.fixture
def tls_redis(tmp_path):
    require(
        REDIS_SERVER is not None and OPENSSL is not None,
        "needs redis-server built with TLS and openssl (both on the CI machine)",
    )
    certs = make_certificates(tmp_path)
    port = free_port()
    with (tmp_path / "redis-tls.log").open("wb") as log:
        process = subprocess.Popen(
            [
                *(REDIS_SERVER, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"),
                *("--tls-cert-file", str(certs["cert"]), "--tls-key-file", str(certs["key"])),
                *("--tls-ca-cert-file", str(certs["ca"]), "--tls-auth-clients", "no"),
                *("--save", "", "--appendonly", "no", "--dir", str(tmp_path)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    query = urllib.parse.urlencode({"ssl_cert_reqs": "required", "ssl_ca_certs": str(certs["ca"])})
    url = f"rediss://127.0.0.1:{port}/0?{query}"
    client = make_redis(url)
    try:

        def pings() -> bool:
            assert process.poll() is None, (tmp_path / "redis-tls.log").read_text()
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_for(pings, timeout_s=20, what="the TLS Redis to answer")
        yield url, port
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_every_component_works_through_a_tls_only_redis(harness, tls_redis):
    url, port = tls_redis
    # The server refuses a plain-text client: whatever works below went over TLS.
    plain = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    with pytest.raises(redis.RedisError):
        plain.ping()
    plain.close()

    harness.configure(redis_url=url)
    harness.start_worker("order")
    harness.start_beat()
    client = harness.start_intake()
    assert client.get("/readyz").status_code == 200
    response = client.post("/v1/order", json={"business_no": "TLS-1"})
    assert response.status_code == 202
    assert response.json()["status"] == "enqueued"
    records = harness.wait_until_final({response.json()["id"]}, timeout_s=60)
    assert [r.status.value for r in records.values()] == ["done"]
    lines = {row["line"]: row for row in client.get("/v1/lines").json()["lines"]}
    assert lines["order"]["live_workers"] == 1
