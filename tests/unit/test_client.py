"""The client module signs as the intake verifies, with the standard library only."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from app import client
from app.config.credentials import IntakeKey
from app.intake.signing import verify

KEYS = {"shop-1": IntakeKey(secret=SecretStr("its-secret-of-32-random-bytes-xx"))}


def test_the_signed_request_verifies_at_the_intake():
    request = client.signed_request(
        "http://127.0.0.1:8000/",
        "order",
        {"business_no": "ORD-1", "note": "café"},
        key_id="shop-1",
        secret="its-secret-of-32-random-bytes-xx",
        nonce="n-1",
    )
    assert request.full_url == "http://127.0.0.1:8000/v1/order"
    assert request.get_method() == "POST"
    headers = {name.lower(): value for name, value in request.header_items()}
    assert (
        request.data
        == json.dumps(
            {"business_no": "ORD-1", "note": "café"}, separators=(",", ":"), ensure_ascii=False
        ).encode()
    )
    caller = verify(
        headers, request.data, keys=KEYS, now_s=int(headers["x-timestamp"]), window_s=300
    )
    assert (caller.key_id, caller.nonce) == ("shop-1", "n-1")


def test_text_is_sent_and_signed_as_given():
    body = '{"business_no" : "ORD-2"}'
    request = client.signed_request(
        "http://h", "order", body, key_id="shop-1", secret="s" * 16, nonce="n"
    )
    assert request.data == body.encode()


def test_without_a_key_a_request_is_unsigned_but_carries_a_nonce():
    request = client.signed_request("http://h", "order", b"{}", key_id=None, secret=None)
    headers = {name.lower() for name, _ in request.header_items()}
    assert "x-nonce" in headers
    assert "x-signature" not in headers


def test_each_request_gets_a_fresh_nonce():
    assert len({client.new_nonce() for _ in range(100)}) == 100


def test_a_url_that_is_not_http_is_refused():
    with pytest.raises(ValueError, match="http:// or https://"):
        client.signed_request("file:///etc/passwd", "order", b"{}", key_id=None, secret=None)


def test_a_line_name_cannot_leave_the_path():
    request = client.signed_request("http://h", "../admin?x=1", b"{}", key_id=None, secret=None)
    assert request.full_url == "http://h/v1/..%2Fadmin%3Fx%3D1"


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (202, {"id": "x", "status": "enqueued"}, None),
        (
            404,
            {"error": {"code": "unknown_line", "message": "unknown line 'x'"}},
            "unknown_line: unknown line 'x'",
        ),
        (502, "Bad Gateway", "HTTP 502"),
    ],
)
def test_an_answer_says_its_error(status, body, error):
    assert client.Answer(status=status, body=body, nonce="n").error == error


def test_the_client_imports_only_the_standard_library():
    source = Path(client.__file__).read_text(encoding="utf-8")
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported - {"__future__"} <= sys.stdlib_module_names
