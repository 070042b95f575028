"""The API's documentation, served by the intake alone: `/docs` references nothing on
another host, each asset it references is served by the intake with its content
type, and the OpenAPI document teaches what an integrator needs: the signature headers and
the exact string signed (its Python example, run as is, gets a record accepted), the admin
bearer token on each admin endpoint (checked against the intake's own answers), and the
error body on every error answer."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import PurePosixPath
from urllib.parse import urljoin, urlsplit

import pytest

# HTTP only: the journal's database plays no part in what is checked.
pytestmark = pytest.mark.journal_independent

KEY_ID, SECRET = "docs-key", "docs-secret-of-16-bytes"
ADMIN_TOKEN = "docs-admin-token"
SIGNATURE_HEADERS = ("X-Key-Id", "X-Timestamp", "X-Nonce", "X-Signature")
CONTENT_TYPES = {
    ".js": ("text/javascript", "application/javascript"),
    ".css": ("text/css",),
    ".png": ("image/png",),
    ".json": ("application/json",),
}
# Any absolute or scheme-relative URL: the pages may name none.
ABSOLUTE_URL = re.compile(r"(?:https?:)?//[\w.-]+", re.IGNORECASE)


class References(HTMLParser):
    """The URLs a page loads: src and href attributes, and the `url:` of Swagger UI's
    set-up."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in {"src", "href"} and value:
                self.urls.append(value)

    def handle_data(self, data: str) -> None:
        self.urls += re.findall(r"\burl:\s*'([^']+)'", data)


@pytest.fixture
def intake(harness):
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}), admin_token=ADMIN_TOKEN)
    return harness.start_intake()


def content_type_fits(path: str, content_type: str) -> bool:
    media_type = content_type.partition(";")[0].strip()
    return media_type in CONTENT_TYPES[PurePosixPath(path).suffix]


def test_docs_page_loads_every_asset_from_the_intake_and_names_no_other_host(intake):
    page = "/docs"
    answer = intake.get(page)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/html")
    assert ABSOLUTE_URL.findall(answer.text) == [], answer.text
    parser = References()
    parser.feed(answer.text)
    assert len(parser.urls) >= 3, parser.urls  # a script, an icon, the document (and a style)
    base = str(intake.base_url)
    for url in parser.urls:
        absolute = urljoin(base + page, url)
        assert urlsplit(absolute).netloc == urlsplit(base).netloc, url
        asset = intake.get(absolute)
        assert asset.status_code == 200, (url, asset.text[:200])
        assert content_type_fits(urlsplit(absolute).path, asset.headers["content-type"]), (
            url,
            asset.headers["content-type"],
        )
        assert asset.content, url
        if url.endswith(".css"):
            # A style sheet would fetch its fonts and images itself.
            imports = re.findall(r"(?:@import|url\()\s*['\"]?((?:https?:)?//[^'\")]+)", asset.text)
            assert imports == [], imports
    scripts = [url for url in parser.urls if url.endswith(".js")]
    assert scripts, parser.urls
    assert "SwaggerUIBundle" in intake.get(urljoin(base, scripts[0])).text[:5000]
    assert '"validatorUrl": null' in answer.text  # its default is on another host


def test_only_the_pages_assets_are_served_and_redoc_is_gone(intake):
    """ReDoc's bundle loads its logo from its CDN: neither it nor its page is served."""
    for path in (
        "/redoc",
        "/docs/assets/redoc.standalone.js",
        "/docs/assets/../../app/config/settings.py",
        "/docs/assets/%2e%2e%2fMETADATA",
        "/docs/assets/missing.js",
    ):
        answer = intake.get(path)
        assert answer.status_code == 404, path
        assert answer.json()["error"]["code"] == "not_found"


def document(intake) -> dict:
    answer = intake.get("/openapi.json")
    assert answer.status_code == 200, answer.text
    return answer.json()


def operations(doc: dict):
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


def test_openapi_declares_the_signature_headers_and_the_signed_string(intake, harness):
    doc = document(intake)
    assert "This intake runs in dev mode" not in doc["info"]["description"]
    window_s = harness.settings().timestamp_window_seconds
    scheme = doc["components"]["securitySchemes"]["requestSignature"]
    assert (scheme["type"], scheme["in"], scheme["name"]) == ("apiKey", "header", "X-Signature")
    signed_string = 'X-Timestamp + "\\n" + X-Nonce + "\\n" + body'
    assert signed_string in scheme["description"]
    assert "HMAC-SHA256" in scheme["description"]
    lines = {line.name for line in harness.runtime().lines}
    for line in lines:
        operation = doc["paths"][f"/v1/{line}"]["post"]
        assert operation["security"] == [{"requestSignature": []}], line
        headers = {p["name"]: p for p in operation["parameters"] if p["in"] == "header"}
        assert set(headers) >= set(SIGNATURE_HEADERS), line
        for name in SIGNATURE_HEADERS:
            assert headers[name]["required"] is True, name
            assert len(headers[name]["description"]) > 60, name
        assert f"{window_s} s" in headers["X-Timestamp"]["description"]
        assert "unix seconds" in headers["X-Timestamp"]["description"]
        assert "dedup key" in headers["X-Key-Id"]["description"]
        assert "409" in headers["X-Nonce"]["description"]
        signature = headers["X-Signature"]["description"]
        assert signed_string in signature
        assert "HMAC-SHA256" in signature
        assert "lowercase hex" in signature
        assert "raw request body" in signature
    # Only the records' endpoints are signed.
    signed = {
        path for path, _, op in operations(doc) if "requestSignature" in str(op.get("security"))
    }
    assert signed == {f"/v1/{line}" for line in lines}


def test_the_documents_worked_example_is_the_hmac_of_the_string_it_names(intake):
    overview = document(intake)["info"]["description"]
    found = re.search(
        r"Secret `(?P<secret>[^`]+)`, `X-Timestamp: (?P<ts>\d+)`,\s*`X-Nonce: (?P<nonce>[^`]+)`,"
        r"\s*body `(?P<body>[^`]+)`.*?`X-Signature: (?P<signature>[0-9a-f]{64})`",
        overview,
        re.DOTALL,
    )
    assert found, overview
    message = f"{found['ts']}\n{found['nonce']}\n{found['body']}".encode()
    expected = hmac.new(found["secret"].encode(), message, hashlib.sha256).hexdigest()
    assert found["signature"] == expected


def test_the_documents_python_example_gets_a_record_accepted(intake, tmp_path):
    """An integrator who copies the example, with their address, key id and secret, gets
    a record journaled on the first try; sent again with the same nonce, it is refused."""
    overview = document(intake)["info"]["description"]
    blocks = re.findall(r"```python\n(.*?)```", overview, re.DOTALL)
    assert len(blocks) == 1, overview
    code = blocks[0]
    for placeholder in (
        '"http://127.0.0.1:8000"',
        '"shop-1"',
        '"its-secret-of-32-random-bytes-xx"',
    ):
        assert placeholder in code, placeholder
    code = (
        code.replace('"http://127.0.0.1:8000"', repr(str(intake.base_url).rstrip("/")))
        .replace('"shop-1"', repr(KEY_ID))
        .replace('"its-secret-of-32-random-bytes-xx"', repr(SECRET))
    )
    script = tmp_path / "send_record.py"
    script.write_text(code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    status, _, body = done.stdout.strip().partition(" ")
    assert status == "202", done.stdout
    record = json.loads(body)
    assert (record["line"], record["business_no"]) == ("order", "ORD-1002")
    assert record["status"] in {"enqueued", "deferred"}


def test_openapi_marks_exactly_the_endpoints_that_ask_for_the_admin_token(intake):
    doc = document(intake)
    scheme = doc["components"]["securitySchemes"]["adminToken"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert "Authorization: Bearer" in scheme["description"]
    asked, declared = set(), set()
    for path, method, operation in operations(doc):
        concrete = re.sub(r"\{line\}", "order", re.sub(r"\{record_id\}", "01NOSUCHRECORD", path))
        answer = intake.request(method, concrete, json={})
        label = f"{method.upper()} {path}"
        if answer.status_code == 401 and answer.json()["error"]["code"] == "admin_required":
            asked.add(label)
        if operation.get("security") == [{"adminToken": []}]:
            declared.add(label)
    assert len(asked) >= 8, asked
    assert declared == asked


def test_openapi_gives_every_error_answer_the_error_body(intake):
    doc = document(intake)
    schema = doc["components"]["schemas"]["ErrorBody"]
    assert schema["required"] == ["error"]
    inner = schema["properties"]["error"]
    assert inner["required"] == ["code", "message"]
    assert inner["properties"]["code"]["type"] == "string"
    assert inner["properties"]["code"]["description"]
    assert inner["properties"]["message"]["type"] == "string"
    reference = {"$ref": "#/components/schemas/ErrorBody"}
    error_answers = 0
    for path, method, operation in operations(doc):
        for status, answer in operation["responses"].items():
            if int(status) >= 400:
                error_answers += 1
                content = answer["content"]["application/json"]["schema"]
                assert content == reference, (method, path, status)
        assert "500" in operation["responses"], (method, path)
        if "429" in operation["responses"]:
            assert "Retry-After" in operation["responses"]["429"]["headers"]
    assert error_answers > 50
    # A real error answer has the documented shape.
    refused = intake.post("/v1/order", json={"business_no": "ORD-1"})
    assert refused.status_code == 401
    body = refused.json()
    assert set(body["error"]) >= {"code", "message"}
    assert isinstance(body["error"]["code"], str)
    assert isinstance(body["error"]["message"], str)
    # The overview lists the codes by status.
    overview = doc["info"]["description"]
    for code in ("bad_signature", "admin_required", "queue_full", "nonce_reused", "unknown_line"):
        assert f"`{code}`" in overview, code


def test_in_dev_mode_the_document_says_so_and_the_signature_headers_are_optional(harness):
    """Dev mode takes unsigned requests: the document must not call the headers required."""
    intake = harness.start_intake()  # the harness's default: dev mode, no keys
    doc = document(intake)
    assert "This intake runs in dev mode" in doc["info"]["description"]
    operation = doc["paths"]["/v1/order"]["post"]
    headers = {p["name"]: p for p in operation["parameters"] if p["in"] == "header"}
    assert {name: headers[name]["required"] for name in SIGNATURE_HEADERS} == dict.fromkeys(
        SIGNATURE_HEADERS, False
    )
    assert intake.post("/v1/order", json={"business_no": "ORD-DEV"}).status_code == 202
