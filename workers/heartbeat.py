"""Worker heartbeats: a thread in the worker's main process refreshes one key per line the
worker consumes; a graceful shutdown removes them, so `NO_CONSUMER` is raised at once.

The thread lives apart from the consumer, so a heartbeat alone would say a worker is alive
while its consumer takes nothing (cancelled, or stalled on a connection). So each beat also
checks the consumer (`app.observe.stall`): one with a free slot that has taken nothing
from its line's waiting queue for `worker_stall_after_seconds` is stalled. Its heartbeat
then says so (it counts as not live), it raises `WORKER_STALLED`, and it restarts its
consumer in-process, once per `worker_stall_after_seconds` until it takes something. A
worker that is shutting down is never stalled, and is not restarted.

The restarts run on the consumer's event loop. When the loop has run none of them for
another `worker_stall_after_seconds` and the consumer is stalled still, the loop itself is
stuck: the worker logs `worker_stuck_exiting`, raises `WORKER_STALLED` saying so, and ends
its process for its supervisor to start a new one. It sends itself SIGQUIT first (Celery's
soft shutdown, then its cold one, re-queue what it holds), and exits with
`STUCK_EXIT_CODE` if it still lives after `exit_after_s` (what it took and did not finish
then comes back after the visibility timeout; each record's lease keeps a second attempt
from starting while the first may still run)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import redis
from celery.signals import worker_ready, worker_shutdown

from app.admission.senders import waiting_messages
from app.clock import utcnow
from app.config.redis import make_redis
from app.config.settings import redis_options
from app.observe.liveness import ConsumerReport, clear_heartbeat, publish_heartbeat
from app.observe.stall import ConsumerSample, StallWatch, watch
from app.telemetry.alerts import Alerter
from app.telemetry.counters import Telemetry
from app.telemetry.events import Event
from app.telemetry.logs import get_logger
from app.threads import LoopThread
from workers.consumer_watch import ConsumerProbe

log = get_logger(__name__)

# EX_SOFTWARE of sysexits.h: not 0, so that a supervisor restarts it, and not Celery's 1.
STUCK_EXIT_CODE = 70
# SIGQUIT, not SIGTERM: Celery's warm shutdown (SIGTERM) waits for every running task, its
# cold one (SIGQUIT) waits `worker_soft_shutdown_seconds` and re-queues the rest, as the
# compose file stops workers.
STUCK_EXIT_SIGNAL = signal.SIGQUIT


class Heartbeat:
    """Publishes this worker's heartbeats, and watches its consumer, until stopped."""

    def __init__(  # noqa: PLR0913 - keyword-only: the worker, its clients and three timings
        self,
        *,
        client: redis.Redis,
        hostname: str,
        lines: list[str],
        ttl_s: float,
        stall_after_s: float,
        exit_after_s: float,
        probe: ConsumerProbe,
        alerts: Alerter,
    ) -> None:
        self.client = client
        self.hostname = hostname
        self.lines = lines
        self.ttl_s = ttl_s
        self.stall_after_s = stall_after_s
        self.exit_after_s = exit_after_s
        self.probe = probe
        self.alerts = alerts
        self.watches: dict[str, StallWatch] = {}
        # A beat that Redis failed logs `heartbeat_failed`; one that raised anything else is
        # logged by the loop (`heartbeat_check_failed`), and the beats go on either way: the
        # worker must keep beating whatever one check raised.
        self._loop = LoopThread(
            self._step,
            name="heartbeat",
            every_s=ttl_s / 3,
            failed_event="heartbeat_check_failed",
        )

    def _depth(self, queue: str) -> int | None:
        try:
            return waiting_messages(self.client, queue)
        except redis.RedisError:
            return None  # unknown: no verdict on the consumer this time

    def _beat(self) -> None:
        waiting_since_s = self.probe.restart_waiting_since_s()
        stuck: list[str] = []
        for line in self.lines:
            now_s = time.monotonic()
            # A line's queue is named after it (`app.celery_app`).
            sample = self.probe.sample(line, queue_depth=self._depth(line))
            seen = watch(self.watches.get(line), sample, now_s=now_s)
            publish_heartbeat(
                self.client,
                line=line,
                hostname=self.hostname,
                pid=os.getpid(),
                ttl_s=self.ttl_s,
                now=utcnow(),
                consumer=ConsumerReport(
                    stalled=seen.is_stalled(now_s=now_s, stall_after_s=self.stall_after_s),
                    taken=sample.taken,
                    consuming=sample.consuming,
                    held=sample.held,
                    slots=sample.slots,
                    starved_s=round(seen.starved_s(now_s=now_s), 1),
                ),
            )
            if seen.exit_due(
                now_s=now_s,
                stall_after_s=self.stall_after_s,
                restart_waiting_since_s=waiting_since_s,
            ):
                stuck.append(line)  # another restart would wait like the others
            elif seen.restart_due(now_s=now_s, stall_after_s=self.stall_after_s):
                self._restart(line, sample, seen, now_s=now_s)
                seen = seen.restarted(now_s=now_s)
            self.watches[line] = seen
        if stuck and waiting_since_s is not None:
            self._exit(stuck, waited_s=time.monotonic() - waiting_since_s)

    def _restart(
        self, line: str, sample: ConsumerSample, seen: StallWatch, *, now_s: float
    ) -> None:
        starved_s = seen.starved_s(now_s=now_s)
        how = "reconnecting it" if sample.consuming else "subscribing it to the queue again"
        pending = self.probe.restarts_pending
        if pending:
            how += f"; {pending} earlier restart(s) still wait for its event loop, which is stuck"
        self.alerts.raise_event(
            Event.WORKER_STALLED,
            line=line,
            message=f"worker {self.hostname} has taken nothing from {line!r} for "
            f"{starved_s:.0f} s while {sample.queue_depth} messages wait and "
            f"{sample.slots - sample.held} of its {sample.slots} slots are free; "
            f"restarting its consumer ({how})",
            hostname=self.hostname,
            queue_depth=sample.queue_depth,
            starved_s=round(starved_s, 1),
            consuming=sample.consuming,
            held=sample.held,
            slots=sample.slots,
            restart=seen.restarts + 1,
            restarts_pending=pending,
        )
        self.probe.restart(line, consuming=sample.consuming, now_s=now_s)

    def _exit(self, lines: list[str], *, waited_s: float) -> None:
        """End this process: its consumer's event loop is stuck (see the module)."""
        self._loop.stop(timeout_s=0)  # this beat is the last
        pending = self.probe.restarts_pending
        log.error(
            "worker_stuck_exiting",
            hostname=self.hostname,
            lines=lines,
            restarts_pending=pending,
            waited_s=round(waited_s, 1),
            exit_after_s=self.exit_after_s,
        )
        for line in lines:
            self.alerts.raise_event(
                Event.WORKER_STALLED,
                line=line,
                message=f"worker {self.hostname} takes nothing from {line!r} and its event "
                f"loop has run none of {pending} restart(s) of its consumer for "
                f"{waited_s:.0f} s: it is stuck, so the worker exits for its supervisor to "
                f"start a new one",
                hostname=self.hostname,
                restarts_pending=pending,
                exiting=True,
            )
        # Written to Redis and sent before the process goes: `close` writes the conditions
        # raised and sends what is queued, without waiting for the sender's next flush.
        self.alerts.close()
        exit_timer = threading.Timer(self.exit_after_s, self._exit_now)
        exit_timer.daemon = True  # a shutdown that ends first ends the process with it
        exit_timer.start()
        self.probe.exit_with(STUCK_EXIT_CODE)
        os.kill(os.getpid(), STUCK_EXIT_SIGNAL)

    def _exit_now(self) -> None:
        log.error("worker_stuck_exited", hostname=self.hostname, exit_code=STUCK_EXIT_CODE)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # os._exit flushes nothing
        os._exit(STUCK_EXIT_CODE)

    def _step(self) -> None:
        try:
            self._beat()
        except redis.RedisError as exc:
            log.warning("heartbeat_failed", error=str(exc))

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(timeout_s=5)
        try:
            for line in self.lines:
                clear_heartbeat(self.client, line=line, hostname=self.hostname)
        except redis.RedisError as exc:
            log.warning("heartbeat_clear_failed", error=str(exc))


_current: list[tuple[Heartbeat, Alerter, Telemetry, redis.Redis]] = []


def _start(sender: Any, **_kwargs: Any) -> None:
    settings = sender.app.pipeline_settings
    lines = [queue.name for queue in sender.task_consumer.queues]
    client = make_redis(settings.redis_url, redis_options(settings))
    telemetry = Telemetry(client)
    alerts = Alerter(settings, clock=utcnow, telemetry=telemetry)
    probe = ConsumerProbe(sender)
    probe.note_shutdown_signals()
    heartbeat = Heartbeat(
        client=client,
        hostname=sender.hostname,
        lines=lines,
        ttl_s=settings.worker_heartbeat_ttl_seconds,
        stall_after_s=settings.worker_stall_after_seconds,
        # Celery's soft shutdown, and as long again as a restart was given.
        exit_after_s=settings.worker_soft_shutdown_seconds + settings.worker_stall_after_seconds,
        probe=probe,
        alerts=alerts,
    )
    heartbeat.start()
    _current.append((heartbeat, alerts, telemetry, client))
    log.info("heartbeat_started", hostname=sender.hostname, lines=lines)


def _stop(**_kwargs: Any) -> None:
    while _current:
        heartbeat, alerts, telemetry, client = _current.pop()
        heartbeat.stop()
        alerts.close()
        telemetry.close()
        client.close()


worker_ready.connect(_start, weak=False)
worker_shutdown.connect(_stop, weak=False)
