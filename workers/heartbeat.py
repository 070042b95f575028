"""Worker heartbeats: a thread in the worker's main process refreshes one key per line the
worker consumes; a graceful shutdown removes them, so `NO_CONSUMER` is raised at once."""

from __future__ import annotations

import os
import threading
from typing import Any

import redis
from celery.signals import worker_ready, worker_shutdown

from app.clock import utcnow
from app.logs import get_logger
from app.observe.liveness import clear_heartbeat, publish_heartbeat
from app.redis_client import make_redis, redis_options

log = get_logger(__name__)


class Heartbeat:
    """Publishes this worker's heartbeats until stopped."""

    def __init__(
        self, *, client: redis.Redis, hostname: str, lines: list[str], ttl_s: float
    ) -> None:
        self.client = client
        self.hostname = hostname
        self.lines = lines
        self.ttl_s = ttl_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def _beat(self) -> None:
        for line in self.lines:
            publish_heartbeat(
                self.client,
                line=line,
                hostname=self.hostname,
                pid=os.getpid(),
                ttl_s=self.ttl_s,
                now=utcnow(),
            )

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                self._beat()
            except redis.RedisError as exc:
                log.warning("heartbeat_failed", error=str(exc))
            self.stopped.wait(self.ttl_s / 3)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        try:
            for line in self.lines:
                clear_heartbeat(self.client, line=line, hostname=self.hostname)
        except redis.RedisError as exc:
            log.warning("heartbeat_clear_failed", error=str(exc))
        self.client.close()


_current: list[Heartbeat] = []


def _start(sender: Any, **_kwargs: Any) -> None:
    settings = sender.app.pipeline_settings
    lines = [queue.name for queue in sender.task_consumer.queues]
    heartbeat = Heartbeat(
        client=make_redis(settings.redis_url, redis_options(settings)),
        hostname=sender.hostname,
        lines=lines,
        ttl_s=settings.worker_heartbeat_ttl_seconds,
    )
    heartbeat.start()
    _current.append(heartbeat)
    log.info("heartbeat_started", hostname=sender.hostname, lines=lines)


def _stop(**_kwargs: Any) -> None:
    while _current:
        _current.pop().stop()


worker_ready.connect(_start, weak=False)
worker_shutdown.connect(_stop, weak=False)
