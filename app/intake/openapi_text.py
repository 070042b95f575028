"""The prose of the OpenAPI document (`app.intake.openapi_doc`): the overview, the signing
recipe with a worked example, the headers, the admin token and the error body. Every
figure in it comes from the code that enforces it (the signing function, the limits, the
error tree), so the text cannot drift from what the intake does."""

from __future__ import annotations

from functools import cache
from typing import Any

from app import errors
from app.ids import MAX_KEY_ID_LENGTH
from app.intake.errors import STATUS_BY_ERROR
from app.intake.signing import MAX_NONCE_LENGTH, sign

# A worked example an integrator can check an implementation against.
EXAMPLE_SECRET = "example-secret-of-32-bytes-xxxxx"  # noqa: S105 - published, signs nothing
EXAMPLE_TIMESTAMP = "1767225600"
EXAMPLE_NONCE = "0f4c1b1e6d2a4f0e9b7c3a5d8e1f2a3b"
EXAMPLE_BODY = b'{"business_no": "ORD-1002"}'
# How the intake answers what the framework refuses before a route runs (app.intake.errors).
FRAMEWORK_CODES = {
    400: ("malformed_body",),
    404: ("not_found",),
    405: ("method_not_allowed",),
    422: ("invalid_request",),
    500: ("internal_error",),
}

MESSAGE = 'X-Timestamp + "\\n" + X-Nonce + "\\n" + body'

RECIPE = f"""\
`X-Signature` is the lowercase hex HMAC-SHA256 of the bytes `{MESSAGE}` (two newline
bytes, no newline at the end), keyed with the key's secret (its UTF-8 bytes), where
`body` is the raw request body exactly as sent, byte for byte: sign the bytes you send,
never a re-serialised JSON."""


def example_signature() -> str:
    return sign(EXAMPLE_SECRET, timestamp=EXAMPLE_TIMESTAMP, nonce=EXAMPLE_NONCE, body=EXAMPLE_BODY)


PYTHON_EXAMPLE = """\
import hashlib, hmac, json, secrets, time, urllib.request

INTAKE = "http://127.0.0.1:8000"
KEY_ID, SECRET = "shop-1", "its-secret-of-32-random-bytes-xx"

body = json.dumps({"business_no": "ORD-1002"}).encode()
timestamp, nonce = str(int(time.time())), secrets.token_hex(16)
message = timestamp.encode() + b"\\n" + nonce.encode() + b"\\n" + body
signature = hmac.new(SECRET.encode(), message, hashlib.sha256).hexdigest()
request = urllib.request.Request(
    INTAKE + "/v1/order",
    data=body,
    method="POST",
    headers={
        "Content-Type": "application/json",
        "X-Key-Id": KEY_ID,
        "X-Timestamp": timestamp,
        "X-Nonce": nonce,
        "X-Signature": signature,
    },
)
with urllib.request.urlopen(request) as answer:
    print(answer.status, answer.read().decode())
"""

SHELL_EXAMPLE = """\
body='{"business_no": "ORD-1002"}'; ts=$(date +%s); nonce=$(openssl rand -hex 16)
sig=$(printf '%s\\n%s\\n%s' "$ts" "$nonce" "$body" \\
      | openssl dgst -sha256 -hmac 'its-secret-of-32-random-bytes-xx' -hex | cut -d' ' -f2)
curl -s -X POST http://127.0.0.1:8000/v1/order -H 'Content-Type: application/json' \\
     -H 'X-Key-Id: shop-1' -H "X-Timestamp: $ts" -H "X-Nonce: $nonce" \\
     -H "X-Signature: $sig" -d "$body"
"""


def signing_section(*, window_s: int) -> str:
    """How to sign a record, in Markdown: the headers, the recipe, a worked example, code."""
    return f"""\
## Signing a record

Every `POST /v1/{{line}}` carries four headers, made with a key id and its secret (the
intake's `PIPELINE_INTAKE_KEYS`, `{{"key id": "secret"}}`):

| header | value |
| --- | --- |
| `X-Key-Id` | the key id |
| `X-Timestamp` | now, in unix seconds; refused beyond ±{window_s} s of the intake's clock |
| `X-Nonce` | new for each record, ≤ {MAX_NONCE_LENGTH} characters (e.g. 32 random hex digits) |
| `X-Signature` | the signature below |

{RECIPE}

(key id, nonce) is the record's dedup key: sending the same nonce and body again answers
200 with the record as it is now and creates nothing, so a timed-out request can be sent again
safely (with a fresh timestamp, and so a fresh signature). The same nonce with another
body, or for another line, is refused with 409 `nonce_reused`. A missing header, an unknown
key id, a timestamp outside the window or a wrong signature is 401 `bad_signature`.

**Worked example.** Secret `{EXAMPLE_SECRET}`, `X-Timestamp: {EXAMPLE_TIMESTAMP}`,
`X-Nonce: {EXAMPLE_NONCE}`, body `{EXAMPLE_BODY.decode()}` (as sent): the message is
`{EXAMPLE_TIMESTAMP}\\n{EXAMPLE_NONCE}\\n{EXAMPLE_BODY.decode()}` and
`X-Signature: {example_signature()}`.

In Python (standard library only):

```python
{PYTHON_EXAMPLE}```

In a shell (curl and openssl):

```sh
{SHELL_EXAMPLE}```

**Standard Webhooks.** A source whose key is of kind `standard-webhooks`
(`{{"key id": {{"kind": "standard-webhooks", "secret": "whsec_…"}}}}`) signs as that
specification says instead: `webhook-id` (its nonce), `webhook-timestamp` (unix seconds,
±{window_s} s) and `webhook-signature`, one or more space-separated `v1,<base64 of the
HMAC-SHA256 of id.timestamp.body, keyed with the base64-decoded part after whsec_>`. Any
Standard Webhooks library signs such requests.
"""


def overview(*, window_s: int, signed: bool) -> str:
    """The document's description: what the intake is, then signing, admin and errors."""
    mode = (
        ""
        if signed
        else (
            "\n\n**This intake runs in dev mode**: it takes unsigned requests from this machine"
            " only (an `X-Nonce`, when sent, is still the dedup key) and opens the admin"
            " endpoints unless an admin token is set. With keys configured, every record must"
            " be signed as below."
        )
    )
    return f"""\
The durable pipeline's intake: it journals each record posted to a business line, then
pushes it onto that line's queue. Every answer is JSON; all times are UTC, ISO 8601.{mode}

{signing_section(window_s=window_s)}
## Admin endpoints

{ADMIN}

## Errors

{ERRORS_TEXT}

| status | `code` |
| --- | --- |
{error_codes_table()}
"""


def signature_scheme(*, window_s: int) -> str:
    return f"""\
A signed record (`POST /v1/{{line}}`) carries `X-Key-Id`, `X-Timestamp` (unix seconds,
within {window_s} s of the intake's clock), `X-Nonce` and `X-Signature`. {RECIPE} The
signature depends on the body, so a value typed here only fits one request: the
description at the top of this page shows how to compute it, with a worked example."""


def signature_headers(*, window_s: int) -> list[tuple[str, str, dict[str, Any]]]:
    """Each signature header: its name, description and schema."""
    return [
        (
            "X-Key-Id",
            "The id of the key the request is signed with (a name of the intake's "
            "`PIPELINE_INTAKE_KEYS`). Together with `X-Nonce` it is the record's dedup key.",
            {"type": "string", "minLength": 1, "maxLength": MAX_KEY_ID_LENGTH},
        ),
        (
            "X-Timestamp",
            f"The time of signing in unix seconds, decimal digits (e.g. `{EXAMPLE_TIMESTAMP}`)."
            f" Refused (401) when more than {window_s} s from the intake's clock.",
            {"type": "string", "pattern": "^[0-9]{1,12}$", "examples": [EXAMPLE_TIMESTAMP]},
        ),
        (
            "X-Nonce",
            f"A token new for each record, at most {MAX_NONCE_LENGTH} characters (e.g. 32 "
            "random hex digits). The same nonce and body again answers 200 with the original "
            "record and creates nothing; with another body or line, 409 `nonce_reused`.",
            {"type": "string", "minLength": 1, "maxLength": MAX_NONCE_LENGTH},
        ),
        (
            "X-Signature",
            f"{RECIPE} Example: secret `{EXAMPLE_SECRET}`, timestamp `{EXAMPLE_TIMESTAMP}`, "
            f"nonce `{EXAMPLE_NONCE}`, body `{EXAMPLE_BODY.decode()}` give "
            f"`{example_signature()}`.",
            {"type": "string", "pattern": "^[0-9a-fA-F]{64}$"},
        ),
    ]


SIGNED_OPERATION = """\
**Signed**: send `X-Key-Id`, `X-Timestamp`, `X-Nonce` and `X-Signature` (see "Signing a
record" at the top of this page); 401 `bad_signature` without them."""

ADMIN = """\
Admin endpoints (marked with a lock) take `Authorization: Bearer <token>`: the token of
`PIPELINE_ADMIN_TOKEN` (its actor is `admin`) or one of `PIPELINE_ADMIN_TOKENS`
(`{"name": "token"}`, its actor is the name); the actor is written in the audit log of
every action. Without a token: 401 `admin_required`; a wrong token: 403 `admin_forbidden`;
no admin token configured on the intake: 401 `admin_not_configured`. In dev mode with no
admin token configured, the admin endpoints are open."""

ERRORS_TEXT = """\
Every error answer is JSON `{"error": {"code": "...", "message": "..."}}`. `code` is
stable: match on it, never on `message`, a sentence for people. Some errors add fields
beside `error`: a 429 `queue_full` carries the kept record (`id`, `line`, `business_no`,
`status`), a 503 `not_ready` lists what `failed`. A 429 (and a 503 `overloaded`) carries
`Retry-After` in seconds. Bad input never gets a 500."""

ERROR_BODY: dict[str, Any] = {
    "title": "ErrorBody",
    "description": "Every error answer: `error`, and for some errors more fields beside it "
    "(a 429 `queue_full`: the kept record's `id`, `line`, `business_no`, `status`; a 503 "
    "`not_ready`: `failed`, what is down).",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {
                    "type": "string",
                    "description": "What went wrong, a stable snake_case name (e.g. "
                    "`bad_signature`, `queue_full`): match on it.",
                    "examples": ["bad_signature"],
                },
                "message": {
                    "type": "string",
                    "description": "The same for people, one sentence; may change.",
                    "examples": ["signature does not match"],
                },
            },
        },
    },
    "additionalProperties": True,
}

RETRY_AFTER_HEADER: dict[str, Any] = {
    "description": "Seconds to wait before sending the request again.",
    "schema": {"type": "integer", "minimum": 1},
}


@cache
def error_codes() -> dict[int, tuple[str, ...]]:
    """The codes of the error tree each status answers with (a status of 500 is a failure
    of ours: those codes never reach a caller but as `internal_error`), and the framework's."""
    codes: dict[int, set[str]] = {status: set(names) for status, names in FRAMEWORK_CODES.items()}
    for cls in _subclasses(errors.PipelineError):
        status = next((STATUS_BY_ERROR[c] for c in cls.__mro__ if c in STATUS_BY_ERROR), 500)
        if status != 500:
            codes.setdefault(status, set()).add(cls.code)
    return {status: tuple(sorted(names)) for status, names in sorted(codes.items())}


def codes_for(status: int) -> str:
    """The codes `status` may carry, as Markdown, or '' for none."""
    return ", ".join(f"`{code}`" for code in error_codes().get(status, ()))


def error_codes_table() -> str:
    return "\n".join(f"| {status} | {codes_for(status)} |" for status in error_codes())


def _subclasses(cls: type[errors.PipelineError]) -> list[type[errors.PipelineError]]:
    found: list[type[errors.PipelineError]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found
