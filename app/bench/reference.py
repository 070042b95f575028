"""The references `pipeline bench` measures ours against, served the same way as our intake
(uvicorn, one process, the same loop and parser):

- `bare_app`: `POST /v1/{line}` reads the body and answers 202; nothing else.
- `naive_app`: what a user writes in an afternoon: a `def` endpoint that inserts the body
  in a table through an ORM session, commits, calls Celery's `apply_async`, answers 202.
  No signature, no bound, no dedup.

`celery` is the Celery app of the naive endpoint, of the bare no-op drain and of the plain
delivery task (`bench.deliver`): what a user writes to post records to a downstream, a
task per record POSTing its JSON body with httpx, one client per worker process."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

import httpx
from celery import Celery
from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import JSON, DateTime, Integer, String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

NOOP_TASK = "bench.noop"
NOOP_QUEUE = "bench_noop"
NAIVE_QUEUE = "bench_naive"
DELIVER_TASK = "bench.deliver"
DELIVER_QUEUE = "bench_deliver"
# The downstream the plain delivery task posts to, named in its worker's environment.
DOWNSTREAM_URL_ENV = "BENCH_DOWNSTREAM_URL"
# As the HTTP sink's: a line's `delivery_timeout_s` by default.
DELIVER_TIMEOUT_S = 10.0

# The plain delivery task's client: one per worker process, made after the fork.
_client: tuple[int, httpx.Client] | None = None


class _Base(DeclarativeBase):
    pass


class NaiveJob(_Base):
    """The naive endpoint's table."""

    __tablename__ = "bench_naive_jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    line: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def _http() -> httpx.Client:
    global _client  # noqa: PLW0603 - one client per worker process
    if _client is None or _client[0] != os.getpid():
        _client = (os.getpid(), httpx.Client(timeout=DELIVER_TIMEOUT_S))
    return _client[1]


def make_celery(broker_url: str) -> Celery:
    """The references' Celery app on `broker_url`: acks late, prefetch 1, as our worker."""
    app = Celery("bench", broker=broker_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
    )

    @app.task(name=NOOP_TASK)
    def noop(*_args: Any) -> None:
        return None

    @app.task(name=DELIVER_TASK)
    def deliver(body: dict[str, Any]) -> None:
        """POST `body` to the downstream with its id as `Idempotency-Key`; a non-2xx
        answer fails the task."""
        response = _http().post(
            os.environ[DOWNSTREAM_URL_ENV], json=body, headers={"Idempotency-Key": body["id"]}
        )
        response.raise_for_status()

    return app


celery = make_celery(os.environ.get("PIPELINE_REDIS_URL", "redis://127.0.0.1:6379/0"))
noop = celery.tasks[NOOP_TASK]


def bare_app() -> FastAPI:
    """202 for any POST, after reading its body."""
    app = FastAPI()

    @app.post("/v1/{line}", status_code=202)
    async def post(line: str, request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse({"line": line, "status": "accepted"}, status_code=202)

    return app


def naive_app() -> FastAPI:
    """Insert + commit + `apply_async` + 202, on `PIPELINE_DATABASE_URL`."""
    engine = create_engine(os.environ["PIPELINE_DATABASE_URL"], pool_size=10)
    _Base.metadata.create_all(engine)
    app = FastAPI()

    @app.post("/v1/{line}", status_code=202)
    def post(line: str, payload: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        with Session(engine) as session:
            job = NaiveJob(line=line, payload=payload, created_at=datetime.now(UTC))
            session.add(job)
            session.commit()
            job_id = job.id
        noop.apply_async(args=(job_id,), queue=NAIVE_QUEUE)
        return {"id": job_id, "status": "accepted"}

    return app
