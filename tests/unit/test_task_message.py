"""Contract of `app.admission.push.build_message` with Celery: the task message we write by
hand is the one Celery's own `app.amqp.as_task_v2` builds for the same task and arguments,
and a Celery worker's request reads it as that task's call.

The transport's part of the envelope (delivery tag, delivery info, body encoding, priority)
is compared with what Celery's publisher writes to a real Redis in
`tests/integration/test_task_message.py`."""

from __future__ import annotations

import base64
import inspect
import json
from typing import Any

import pytest
from celery.worker.request import Request
from kombu import Connection, serialization
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from app.admission.push import TASK_NAME, build_message
from app.celery_app import create_celery
from app.config.settings import load_settings
from workers import tasks

ORIGIN = "4242@worker-host"
QUEUE = "order"
ARGUMENTS = [pytest.param("01ONE", id="one-record"), pytest.param(["01ONE", "01TWO"], id="batch")]
# The business numbers of those records, which the message names beside its line.
BUSINESS_NOS = {"01ONE": "B-1", "01TWO": "B-2"}


@pytest.fixture(scope="module")
def celery() -> Any:
    """The pipeline's Celery app (connects to nothing) with its task registered."""
    app = create_celery(load_settings())
    app.loader.import_default_modules()
    return app


def _first_id(arg: str | list[str]) -> str:
    return arg if isinstance(arg, str) else arg[0]


def _business_nos(arg: str | list[str]) -> str | list[str]:
    return BUSINESS_NOS[arg] if isinstance(arg, str) else [BUSINESS_NOS[i] for i in arg]


def _celerys(celery: Any, arg: str | list[str]) -> Any:
    """Celery's own protocol-2 message for the pipeline's task called with `arg`, with the
    kwargsrepr we give it (as `apply_async(kwargsrepr=...)` would): the line and the
    business numbers, for Flower."""
    task = celery.tasks[TASK_NAME]
    return celery.amqp.as_task_v2(
        _first_id(arg),
        TASK_NAME,
        args=[arg],
        kwargs={},
        origin=ORIGIN,
        ignore_result=task.ignore_result,
        kwargsrepr=repr({"line": QUEUE, "business_no": _business_nos(arg)}),
    )


def _ours(arg: str | list[str]) -> dict[str, Any]:
    raw = build_message(arg, queue=QUEUE, origin=ORIGIN, business_nos=_business_nos(arg))
    message: dict[str, Any] = json.loads(raw)
    return message


def _as_json(value: Any) -> Any:
    """`value` as it reads after a JSON round trip (tuples become lists)."""
    return json.loads(json.dumps(value))


def test_the_task_compared_with_is_the_one_the_workers_run(celery):
    assert celery.tasks[TASK_NAME].run.__func__ is tasks.process.run.__func__


@pytest.mark.parametrize("arg", ARGUMENTS)
def test_our_headers_are_celerys_protocol_2_headers_for_the_same_call(celery, arg):
    celerys = _celerys(celery, arg)
    ours = _ours(arg)
    assert list(ours["headers"]) == list(celerys.headers)
    assert ours["headers"] == _as_json(celerys.headers)


@pytest.mark.parametrize("arg", ARGUMENTS)
def test_our_properties_carry_celerys_message_properties(celery, arg):
    celerys = _celerys(celery, arg)
    ours = _ours(arg)["properties"]
    assert set(celerys.properties) <= set(ours)
    assert {name: ours[name] for name in celerys.properties} == celerys.properties


@pytest.mark.parametrize("arg", ARGUMENTS)
def test_our_body_is_celerys_body_serialized_the_way_celery_serializes_it(celery, arg):
    celerys = _celerys(celery, arg)
    content_type, content_encoding, data = serialization.dumps(
        celerys.body, serializer=celery.conf.task_serializer
    )
    ours = _ours(arg)
    assert (ours["content-type"], ours["content-encoding"]) == (content_type, content_encoding)
    body = base64.b64decode(ours["body"])
    assert body == data.encode(content_encoding)
    args, kwargs, embed = json.loads(body)
    assert (args, kwargs) == ([arg], {})
    assert embed == _as_json(celerys.body[2])


@pytest.mark.parametrize("arg", ARGUMENTS)
def test_a_celery_worker_request_reads_our_message_as_the_tasks_call(celery, arg):
    """kombu's Redis transport makes its messages with the virtual transport's `Message`,
    which the in-memory transport shares; Celery's worker builds a `Request` from it."""
    assert kombu_redis.Channel.Message is virtual.Message
    task = celery.tasks[TASK_NAME]
    with Connection("memory://") as conn:
        message = conn.default_channel.message_to_python(_ours(arg))
        request = Request(message, app=celery, task=task)
    assert (request.id, request.name) == (_first_id(arg), TASK_NAME)
    assert (request.args, request.kwargs) == ([arg], {})
    assert request.ignore_result is True
    assert request.delivery_info["routing_key"] == QUEUE
    assert request.content_type == "application/json"
    bound = inspect.signature(task.run).bind(*request.args, **request.kwargs)
    assert bound.arguments == {"record_ids": arg}


# One traceparent per record: the records of a batch may come from different traces.
TRACEPARENTS = {
    "01ONE": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "01TWO": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
}


def _traceparents_of(arg: str | list[str]) -> dict[str, str]:
    return {i: TRACEPARENTS[i] for i in ([arg] if isinstance(arg, str) else arg)}


@pytest.mark.parametrize("arg", ARGUMENTS)
def test_traced_records_traceparents_are_the_header_celery_publishes_given_to_apply_async(
    celery, arg
):
    celerys = _celerys(celery, arg)
    # What Celery's publisher does with `apply_async(headers=...)`: adds them after its own.
    celerys.headers.update({"traceparents": _traceparents_of(arg)})
    raw = build_message(
        arg,
        queue=QUEUE,
        origin=ORIGIN,
        business_nos=_business_nos(arg),
        traceparents=_traceparents_of(arg),
    )
    ours = json.loads(raw)
    assert list(ours["headers"]) == list(celerys.headers)
    assert ours["headers"] == _as_json(celerys.headers)
    task = celery.tasks[TASK_NAME]
    with Connection("memory://") as conn:
        message = conn.default_channel.message_to_python(ours)
        request = Request(message, app=celery, task=task)
    assert request.request_dict["traceparents"] == _traceparents_of(arg)


def test_an_untraced_message_carries_no_traceparents_header():
    assert (
        "traceparents"
        not in json.loads(build_message(["01ONE"], queue=QUEUE, origin=ORIGIN))["headers"]
    )
    assert (
        "traceparents"
        not in json.loads(build_message("01ONE", queue=QUEUE, origin=ORIGIN, traceparents={}))[
            "headers"
        ]
    )
