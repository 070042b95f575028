"""Contract of the task message we push with the one Celery's own publisher writes through
kombu's Redis transport, on a real server: the same JSON but for the delivery tag (unique
per message), and a Celery consumer receives ours as the pipeline task's call."""

from __future__ import annotations

import json
from typing import Any

import pytest
from celery.worker.request import Request

from app.admission.push import TASK_NAME, Pusher
from app.celery_app import create_celery
from app.config.redis import make_redis
from app.config.settings import load_settings

pytestmark = pytest.mark.journal_independent

QUEUE = "order"
ARGUMENTS = [pytest.param(["01ONE"], id="one-record"), pytest.param(["01ONE", "01TWO"], id="batch")]


def _business_nos(ids: list[str]) -> list[str]:
    return [f"B-{record_id}" for record_id in ids]


@pytest.fixture
def celery(redis_url: str) -> Any:
    app = create_celery(load_settings(redis_url=redis_url))
    app.loader.import_default_modules()
    return app


@pytest.fixture
def client(redis_url: str) -> Any:
    client = make_redis(redis_url)
    try:
        yield client
    finally:
        client.close()


def _push_ours(client: Any, ids: list[str]) -> dict[str, Any]:
    """Push `ids` as one message the way the intake does; the message as Redis holds it."""
    pushed = Pusher(client).push(
        QUEUE, ids, max_length=10, batch_size=len(ids), business_nos=_business_nos(ids)
    )
    assert pushed.pushed == len(ids)
    [raw] = client.lrange(QUEUE, 0, -1)
    client.delete(QUEUE)
    message: dict[str, Any] = json.loads(raw)
    return message


@pytest.mark.parametrize("ids", ARGUMENTS)
def test_celerys_publisher_writes_the_message_we_push_but_for_its_delivery_tag(celery, client, ids):
    ours = _push_ours(client, ids)
    arg = ids[0] if len(ids) == 1 else ids
    business_nos = _business_nos(ids)
    task = celery.tasks[TASK_NAME]
    message = celery.amqp.as_task_v2(
        ids[0],
        TASK_NAME,
        args=[arg],
        kwargs={},
        origin=ours["headers"]["origin"],
        ignore_result=task.ignore_result,
        # What we give Celery's publisher to show in task events (Flower): the line and
        # the records' business numbers.
        kwargsrepr=repr(
            {"line": QUEUE, "business_no": business_nos[0] if len(ids) == 1 else business_nos}
        ),
    )
    with celery.producer_or_acquire() as producer:
        celery.amqp.send_task_message(producer, TASK_NAME, message, queue=QUEUE)
    [raw] = client.lrange(QUEUE, 0, -1)
    celerys = json.loads(raw)

    assert isinstance(ours["properties"].pop("delivery_tag"), str)
    assert isinstance(celerys["properties"].pop("delivery_tag"), str)
    assert list(ours) == list(celerys)
    assert list(ours["headers"]) == list(celerys["headers"])
    assert sorted(ours["properties"]) == sorted(celerys["properties"])
    assert ours == celerys


@pytest.mark.parametrize("ids", ARGUMENTS)
def test_a_celery_consumer_receives_our_message_as_the_tasks_call(celery, client, ids):
    Pusher(client).push(QUEUE, ids, max_length=10, batch_size=len(ids))
    arg = ids[0] if len(ids) == 1 else ids
    received: list[Any] = []
    with celery.connection_for_read() as conn:
        queue = celery.amqp.queues[QUEUE]
        with conn.Consumer(queue, on_message=received.append, accept=["json"]):
            conn.drain_events(timeout=5)
        [message] = received
        request = Request(message, app=celery, task=celery.tasks[TASK_NAME])
        assert (request.id, request.name) == (ids[0], TASK_NAME)
        assert (request.args, request.kwargs) == ([arg], {})
        assert request.delivery_info["routing_key"] == QUEUE
        message.ack()
    assert client.llen(QUEUE) == 0
    assert client.hlen("unacked") == 0
