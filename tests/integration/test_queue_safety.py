"""What lands on a line's Redis list without going through the intake: a message whose body
is pickle (or any other non-JSON content type) is refused by the worker and never run,
and the worker goes on with the work behind it."""

from __future__ import annotations

import base64
import json
import pickle
import uuid
from pathlib import Path

import pytest
import redis

from app.admission.push import TASK_NAME

# HTTP, Redis or the browser: the journal's database plays no part.
pytestmark = pytest.mark.journal_independent


class TouchOnLoad:
    """Unpickling this creates `path`: the side effect that must never happen."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def raw_message(body: bytes, *, content_type: str, queue: str) -> bytes:
    task_id = str(uuid.uuid4())
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "binary",
            "content-type": content_type,
            "headers": {"lang": "py", "task": TASK_NAME, "id": task_id, "root_id": task_id},
            "properties": {
                "correlation_id": task_id,
                "reply_to": "",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    ).encode()


@pytest.mark.parametrize(
    ("content_type", "serializer"),
    [
        ("application/x-python-serialize", "pickle"),
        ("application/x-yaml", "yaml"),
    ],
)
def test_a_non_json_message_on_a_line_is_refused_and_never_run(
    harness, tmp_path, content_type, serializer
):
    marker = tmp_path / "unpickled"
    payload = (((TouchOnLoad(marker),), {}, {}),)
    if serializer == "pickle":
        body = pickle.dumps(payload)
    else:  # a YAML document that a permissive loader would turn into a call
        body = f"!!python/object/apply:pathlib.Path.touch [{str(marker)!r}]".encode()
    worker = harness.start_worker("order")
    client = harness.start_intake()
    with redis.Redis.from_url(harness.env["PIPELINE_REDIS_URL"]) as r:
        r.lpush("order", raw_message(body, content_type=content_type, queue="order"))
    # Work queued behind the hostile message is still done.
    response = client.post("/v1/order", json={"business_no": "AFTER"})
    assert response.status_code == 202
    records = harness.wait_until_final({response.json()["id"]}, timeout_s=60)
    assert [r.status.value for r in records.values()] == ["done"]
    assert not marker.exists(), "the worker deserialized a non-JSON message"
    assert worker.process is not None
    assert worker.process.poll() is None, worker.output()[-2000:]
    assert "untrusted content" in worker.output() or "ContentDisallowed" in worker.output()
    with redis.Redis.from_url(harness.env["PIPELINE_REDIS_URL"]) as r:
        assert r.llen("order") == 0
