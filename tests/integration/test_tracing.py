"""A record traced across processes: with `PIPELINE_OTEL_ENDPOINT` set, the intake process and
the worker process export to a real OTLP/HTTP collector (on 127.0.0.1) spans of one trace,
from the intake's request to the sink's call, and the downstream receives that trace's
`traceparent`; unset, nothing is exported and no traceparent is sent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.otlp import Collector, ReceivedSpan
from tests.support.processes import TLS_CONTEXT, free_port, wait_for
from tests.support.recorder import Recorder

PIPELINE = str(Path(sys.executable).with_name("pipeline"))
# The SDK's batch delay (its own default is 5 s): the spans arrive while the test waits.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
# A caller's own trace, as its traceparent header carries it.
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_TRACEPARENT = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"


def _start_intake(harness) -> str:
    """`pipeline intake` in a process of its own; its base URL once it answers."""
    port = free_port()
    harness.run("intake", "--port", str(port))
    base = f"http://127.0.0.1:{port}"

    def listening() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=2, verify=TLS_CONTEXT).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(listening, timeout_s=30, what="the intake to listen")
    return base


def _set_env(harness, **variables: str) -> None:
    for name, value in variables.items():
        harness.env[name] = value
        harness.monkeypatch.setenv(name, value)


def _the_one(spans: list[ReceivedSpan], *, kind: str, service: str) -> ReceivedSpan:
    found = [s for s in spans if s.kind == kind and s.service == service]
    assert len(found) == 1, (kind, service, spans)
    return found[0]


def test_a_record_is_one_trace_from_the_intakes_request_through_the_worker_to_the_downstream(
    harness,
):
    collector = Collector().start()
    downstream = Recorder().start()
    try:
        harness.configure(
            otel_endpoint=collector.url,
            lines__shipment__downstream_url=f"{downstream.url}/in",
        )
        _set_env(harness, **FAST_EXPORT)
        base = _start_intake(harness)
        harness.start_worker("shipment")
        answer = httpx.post(f"{base}/v1/shipment", json={"business_no": "SH-1"}, timeout=30)
        assert answer.status_code == 202, answer.text
        record_id = answer.json()["id"]
        harness.wait_until_final({record_id})

        shown = httpx.get(f"{base}/v1/records/{record_id}", timeout=30).json()
        assert shown["status"] == "done"
        trace_id = shown["trace_id"]
        assert isinstance(trace_id, str)
        assert len(trace_id) == 32

        def the_trace() -> list[ReceivedSpan]:
            return [s for s in collector.snapshot() if s.trace_id == trace_id]

        wanted = {("server", "pipeline-intake"), ("producer", "pipeline-intake")}
        wanted |= {("consumer", "pipeline-worker"), ("client", "pipeline-worker")}
        wait_for(
            lambda: wanted <= {(s.kind, s.service) for s in the_trace()},
            timeout_s=30,
            what=f"the four spans of the trace in the collector, {collector.snapshot()}",
        )
        spans = the_trace()
        request = _the_one(spans, kind="server", service="pipeline-intake")
        push = _the_one(spans, kind="producer", service="pipeline-intake")
        attempt = _the_one(spans, kind="consumer", service="pipeline-worker")
        call = _the_one(spans, kind="client", service="pipeline-worker")
        # One trace, each span the child of the one before it.
        assert request.name == "POST /v1/{line}"
        assert request.parent_span_id == ""
        assert request.attributes["http.response.status_code"] == 202
        assert (push.name, push.parent_span_id) == ("push shipment", request.span_id)
        assert push.attributes["pipeline.record_id"] == record_id
        assert push.attributes["pipeline.pushed"] is True
        assert (attempt.name, attempt.parent_span_id) == ("attempt shipment", push.span_id)
        assert attempt.attributes["pipeline.record_id"] == record_id
        assert attempt.attributes["pipeline.outcome"] == "done"
        assert (call.name, call.parent_span_id) == ("POST", attempt.span_id)
        assert call.attributes["http.response.status_code"] == 200
        assert not any(s.failed for s in (request, push, attempt, call))

        # The downstream received the sink call's own traceparent.
        (delivered,) = downstream.snapshot()
        assert delivered.body["id"] == record_id
        assert delivered.headers["traceparent"].split("-")[1:3] == [trace_id, call.span_id]

        shown_by_cli = subprocess.run(
            [PIPELINE, "records", "show", record_id],
            env={**harness.env, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert shown_by_cli.returncode == 0, shown_by_cli.stderr
        rows = [
            [cell.strip() for cell in row.split("│")] for row in shown_by_cli.stdout.split("\n")
        ]
        assert ["", "trace id", trace_id, ""] in rows
    finally:
        downstream.stop()
        collector.stop()


def test_a_callers_traceparent_makes_the_record_part_of_the_callers_trace(harness):
    collector = Collector().start()
    downstream = Recorder().start()
    try:
        harness.configure(
            otel_endpoint=collector.url,
            lines__shipment__downstream_url=f"{downstream.url}/in",
        )
        _set_env(harness, **FAST_EXPORT)
        client = harness.start_intake()
        harness.start_worker("shipment")
        answer = client.post(
            "/v1/shipment",
            json={"business_no": "SH-2"},
            headers={"traceparent": CALLER_TRACEPARENT},
        )
        assert answer.status_code == 202, answer.text
        record_id = answer.json()["id"]
        harness.wait_until_final({record_id})
        assert client.get(f"/v1/records/{record_id}").json()["trace_id"] == CALLER_TRACE
        (delivered,) = downstream.snapshot()
        assert delivered.headers["traceparent"].split("-")[1] == CALLER_TRACE
        wait_for(
            lambda: any(
                s.kind == "server" and s.parent_span_id == "00f067aa0ba902b7"
                for s in collector.snapshot()
            ),
            timeout_s=30,
            what="the request span, a child of the caller's",
        )
    finally:
        downstream.stop()
        collector.stop()


def test_without_the_endpoint_nothing_is_exported_and_no_traceparent_is_sent(harness):
    collector = Collector().start()
    downstream = Recorder().start()
    try:
        harness.configure(
            lines__shipment__downstream_url=f"{downstream.url}/in",
            worker_soft_shutdown_seconds="0",
        )
        # The SDK's own variables name the collector: only PIPELINE_OTEL_ENDPOINT turns
        # tracing on.
        _set_env(
            harness,
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.url,
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{collector.url}/v1/traces",
            **FAST_EXPORT,
        )
        base = _start_intake(harness)
        worker = harness.start_worker("shipment")
        answer = httpx.post(
            f"{base}/v1/shipment",
            json={"business_no": "SH-3"},
            headers={"traceparent": CALLER_TRACEPARENT},
            timeout=30,
        )
        assert answer.status_code == 202, answer.text
        record_id = answer.json()["id"]
        harness.wait_until_final({record_id})
        assert httpx.get(f"{base}/v1/records/{record_id}", timeout=30).json()["trace_id"] is None
        (delivered,) = downstream.snapshot()
        assert "traceparent" not in {name.lower() for name in delivered.headers}
        # Stopped gracefully, both have run their exit (where a batch of spans would be
        # flushed): still nothing reached the collector.
        for component in harness.components:
            component.stop(timeout_s=30)
        assert worker.process is not None
        assert worker.process.returncode == 0, worker.output()[-2000:]
        assert collector.posts == 0
    finally:
        downstream.stop()
        collector.stop()


# Run in a fresh interpreter where the `otel` extra's packages cannot be imported (as where
# it is not installed); opentelemetry-api itself is a dependency of the product.
WITHOUT_THE_SDK = """
import importlib.abc, json, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())

from fastapi.testclient import TestClient
from app.errors import ConfigError
from app.intake.main import create_app
from app.config.settings import load_settings
import workers.tasks

app = create_app(load_settings())
# Dev mode answers loopback clients, by loopback names, only.
with TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000)) as client:
    healthz = client.get("/healthz").status_code
try:
    create_app(load_settings().model_copy(update={"otel_endpoint": "http://127.0.0.1:9/"}))
    refused = None
except ConfigError as exc:
    refused = str(exc)
print(json.dumps({"healthz": healthz, "refused": refused}))
"""


def test_the_product_runs_without_the_sdk_and_asking_for_tracing_then_says_what_to_install(
    harness,
):
    ran = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_SDK],
        env=harness.env,
        cwd=harness.tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    outcome = json.loads(ran.stdout.strip().splitlines()[-1])
    assert outcome["healthz"] == 200
    assert "PIPELINE_OTEL_ENDPOINT" in outcome["refused"]
    assert "pip install 'durable-pipeline[otel]'" in outcome["refused"]


def test_a_retry_pushed_by_the_sweeper_stays_in_the_records_trace(harness):
    collector = Collector().start()
    downstream = Recorder(status=500).start()
    try:
        harness.configure(
            otel_endpoint=collector.url,
            lines__shipment__downstream_url=f"{downstream.url}/in",
            lines__shipment__backoff_initial_s="0.05",
            lines__shipment__backoff_max_s="0.2",
        )
        _set_env(harness, **FAST_EXPORT)
        client = harness.start_intake()
        harness.start_worker("shipment")
        harness.start_beat()
        answer = client.post("/v1/shipment", json={"business_no": "SH-4"})
        assert answer.status_code == 202, answer.text
        record_id = answer.json()["id"]
        wait_for(downstream.snapshot, timeout_s=30, what="the first delivery")
        downstream.status = 200
        final = harness.wait_until_final({record_id})[record_id]
        assert final.status.value == "done"
        assert final.attempts >= 2
        trace_id = client.get(f"/v1/records/{record_id}").json()["trace_id"]
        deliveries = downstream.snapshot()
        assert len(deliveries) == final.attempts
        assert {d.headers["traceparent"].split("-")[1] for d in deliveries} == {trace_id}

        def the_trace() -> list[ReceivedSpan]:
            return [s for s in collector.snapshot() if s.trace_id == trace_id]

        def every_attempt_exported() -> bool:
            # Each process exports on its own, and an attempt's span ends after its outcome
            # is committed: wait for every attempt, its delivery and the push it came from.
            spans = the_trace()
            kinds = [s.kind for s in spans]
            pushes = {s.span_id for s in spans if s.kind == "producer"}
            parents = {s.parent_span_id for s in spans if s.kind == "consumer"}
            counted = kinds.count("consumer") == kinds.count("client") == final.attempts
            return counted and parents <= pushes

        wait_for(
            every_attempt_exported,
            timeout_s=30,
            what="the spans of every attempt and delivery in the record's trace",
        )
        spans = the_trace()
        request = _the_one(spans, kind="server", service="pipeline-intake")
        pushes = [s for s in spans if s.kind == "producer"]
        attempts = [s for s in spans if s.kind == "consumer"]
        # The first push is the intake's; the retries are the sweeper's, in the beat.
        assert {p.service for p in pushes} == {"pipeline-intake", "pipeline-beat"}
        assert {p.parent_span_id for p in pushes} == {request.span_id}
        assert len(attempts) == final.attempts
        assert {a.parent_span_id for a in attempts} <= {p.span_id for p in pushes}
        assert [a.attributes["pipeline.outcome"] for a in attempts].count("done") == 1
        assert sum(a.failed for a in attempts) == final.attempts - 1
    finally:
        downstream.stop()
        collector.stop()
