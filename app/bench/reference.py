"""The references `pipeline bench` measures ours against, served the same way as our intake
(uvicorn, one process, the same loop and parser):

- `bare_app`: `POST /v1/{line}` reads the body and answers 202; nothing else.
- `naive_app`: what a user writes in an afternoon: a `def` endpoint that inserts the body
  in a table through an ORM session, commits, calls Celery's `apply_async`, answers 202.
  No signature, no bound, no dedup.

`celery` is the Celery app of the naive endpoint and of the bare no-op drain."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import JSON, DateTime, Integer, String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

NOOP_TASK = "bench.noop"
NOOP_QUEUE = "bench_noop"
NAIVE_QUEUE = "bench_naive"


class _Base(DeclarativeBase):
    pass


class NaiveJob(_Base):
    """The naive endpoint's table."""

    __tablename__ = "bench_naive_jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    line: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def _make_celery() -> Celery:
    app = Celery("bench", broker=os.environ.get("PIPELINE_REDIS_URL", "redis://127.0.0.1:6379/0"))
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

    return app


celery = _make_celery()
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
