"""Fuzzing the intake with schemathesis, from its own OpenAPI document: every endpoint, each
request signed (the intake runs with keys) and carrying the admin token. No answer may be
a 500, every error must be the JSON error body, every answer must match the
document. The outcomes by status code are printed at the end."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
)

from tests.support.harness import signed_headers
from tests.support.processes import TLS_CONTEXT

KEY_ID, SECRET = "fuzz-key", "fuzz-secret-of-16-bytes"
ADMIN = "fuzz-admin-token"
EXAMPLES = 40
OUTCOMES: Counter[int] = Counter()


@pytest.fixture(scope="module", autouse=True)
def _hypothesis_directory(tmp_path_factory):
    """Hypothesis keeps its caches in `.hypothesis/` of the working directory, the source
    tree: here they go to a temporary directory instead."""
    set_hypothesis_home_dir(tmp_path_factory.mktemp("hypothesis"))
    try:
        yield
    finally:
        set_hypothesis_home_dir(None)


@pytest.fixture(scope="module")
def outcomes():
    yield OUTCOMES
    total = sum(OUTCOMES.values())
    print(f"\nfuzz: {total} requests; by status: {dict(sorted(OUTCOMES.items()))}")


@pytest.fixture
def fuzz_intake(harness):
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}), admin_token=ADMIN)
    client = harness.start_intake()
    return str(client.base_url).rstrip("/")


def error_is_json(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    body = response.json()
    assert set(body) >= {"error"}, body
    assert isinstance(body["error"]["code"], str), body
    assert isinstance(body["error"]["message"], str), body
    assert body["error"]["message"], body


def send_signed(case, base_url: str) -> httpx.Response:
    """Send `case` as a client with a key and the admin token would."""
    kwargs = case.as_transport_kwargs(base_url=base_url)
    if "json" in kwargs:
        content = json.dumps(kwargs.pop("json")).encode()
    else:
        data = kwargs.pop("data", None) or b""
        content = data if isinstance(data, bytes) else str(data).encode()
    headers = {k: str(v) for k, v in (kwargs.pop("headers", None) or {}).items()}
    # Whatever was generated (the document declares both schemes), the signature and the
    # admin token are made here.
    made_here = {"x-key-id", "x-timestamp", "x-nonce", "x-signature", "content-type"}
    # And the message's framing is the client's own: a generated Transfer-Encoding other
    # than chunked is refused by httpx before anything is sent (hostile framing is sent
    # raw, in test_hostile_clients).
    framing = {"transfer-encoding", "content-length", "host", "connection"}
    for name in list(headers):
        if name.lower() in {*made_here, *framing, "authorization"}:
            del headers[name]
    headers.update(signed_headers(KEY_ID, SECRET, content))
    headers["authorization"] = f"Bearer {ADMIN}"
    return httpx.request(
        kwargs["method"],
        kwargs["url"],
        params=kwargs.get("params"),
        content=content,
        headers=headers,
        timeout=30,
        verify=TLS_CONTEXT,
    )


# Forty examples of each operation, both ways: with the console's reads and switches that
# is some 1,400 requests, two minutes on a busy two-core machine.
@pytest.mark.long
@pytest.mark.timeout(360)
def test_every_endpoint_answers_fuzzed_requests_by_its_document(fuzz_intake, outcomes):
    api = schemathesis.openapi.from_url(f"{fuzz_intake}/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 11, [op.label for op in operations]

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz_operation(operation, mode, fuzz_intake, outcomes)


def fuzz_operation(operation, mode, base_url: str, outcomes: Counter[int]) -> None:
    """Requests that fit the document (positive) and that do not (negative)."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def fuzz(case):
        response = send_signed(case, base_url)
        outcomes[response.status_code] += 1
        assert response.status_code != 500, f"{operation.label}: {response.text}"
        error_is_json(response)
        # Every check but two. "A schema-valid request is accepted": the intake refuses, on
        # purpose, bodies a JSON schema cannot describe (a NUL or a lone surrogate in any
        # string, a time with no UTC equivalent), with a 422. "A schema-violating request
        # is refused": a query string carries text, and a value the document types as an
        # object or a number arrives as the text that stands for it.
        # The headers sent are named as the run's own: schemathesis takes the signature and
        # the token as given credentials (not generated ones), and checks that the intake
        # refuses the request without them, and with wrong ones.
        case.validate_response(
            response,
            excluded_checks=[positive_data_acceptance, negative_data_rejection],
            headers=dict(response.request.headers),
        )

    try:
        fuzz()
    except Unsatisfiable:
        # An operation that takes no input has no invalid request to make.
        assert mode is GenerationMode.NEGATIVE, operation.label


# What a stranger's client gets from an admin endpoint, however its request is made: the
# refusal, from the headers alone. Each case is sent as it was generated (a valid request
# or not), without the token, with a wrong one, and with the right one from another
# site's page.
STRANGERS = (
    ({}, 401, "admin_required"),
    ({"authorization": "Bearer not-the-admin-token"}, 403, "admin_forbidden"),
)
CROSS_SITE = {"origin": "http://127.0.0.1:9", "authorization": f"Bearer {ADMIN}"}
ADMIN_EXAMPLES = 10


def is_admin(operation) -> bool:
    security = operation.definition.raw.get("security", [])
    return any("adminToken" in requirement for requirement in security)


@pytest.mark.long
@pytest.mark.timeout(240)
def test_every_admin_endpoint_refuses_fuzzed_requests_without_the_token(fuzz_intake, outcomes):
    api = schemathesis.openapi.from_url(f"{fuzz_intake}/openapi.json")
    admin = [op for op in (r.ok() for r in api.get_all_operations()) if is_admin(op)]
    # Records (list, one, retry, cancel, bulk), replay, audit, schedules, lines, alerts.
    assert len(admin) >= 12, [op.label for op in admin]
    for operation in admin:
        fuzz_as_stranger(operation, fuzz_intake, outcomes)


def fuzz_as_stranger(operation, base_url: str, outcomes: Counter[int]) -> None:
    """Requests that fit the document, each sent as `STRANGERS` (and from another site's
    page) would send it: each refused by the gate, by the code it names."""
    refusals = [*STRANGERS]
    if operation.method.upper() != "GET":
        refusals.append((CROSS_SITE, 403, "cross_site_request"))

    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    @settings(
        max_examples=ADMIN_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def fuzz(case):
        kwargs = case.as_transport_kwargs(base_url=base_url)
        content = json.dumps(kwargs["json"]).encode() if "json" in kwargs else b""
        sent = {
            k: str(v)
            for k, v in (kwargs.get("headers") or {}).items()
            if k.lower() != "authorization"
        }
        if content:
            sent["content-type"] = "application/json"
        for headers, status, code in refusals:
            response = httpx.request(
                kwargs["method"],
                kwargs["url"],
                params=kwargs.get("params"),
                content=content,
                headers={**sent, **headers},
                timeout=30,
            )
            outcomes[response.status_code] += 1
            assert response.status_code == status, f"{operation.label}: {response.text}"
            assert response.json()["error"]["code"] == code, operation.label

    fuzz()
