"""`Runtime`: what a process of the pipeline holds, built once at its entry point.

The composition root: it builds the clients (journal, Redis, HTTP) and the pieces that
use them, each given only what it uses. Only entry points (the intake app, the worker
task, the beat scheduler, the command line) import it; nothing below them does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import redis
from sqlalchemy import Engine

from app.admission.accept import Acceptor
from app.admission.pause import LinePauser, PausedLines
from app.admission.push import Pusher
from app.clock import utcnow
from app.config.redis import make_redis
from app.config.settings import Settings, redis_options
from app.delivery.circuit import CircuitReader
from app.delivery.engine import AttemptEngine
from app.delivery.sinks import make_http_client
from app.journal.engine import make_engine
from app.journal.journal import Journal
from app.lines import LineRegistry
from app.observe.line_view import LineView
from app.observe.monitor import Monitor
from app.recovery.lost_messages import LostMessages
from app.recovery.replay import Replayer
from app.recovery.retention import Retention
from app.recovery.sweeper import Sweeper
from app.schedules.fires import ScheduleFirer
from app.telemetry.alerts import Alerter
from app.telemetry.counters import Telemetry
from app.telemetry.tracing import NO_TRACER, SCOPE, make_tracer_provider

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer


@dataclass(frozen=True, kw_only=True)
class Runtime:
    """Settings, lines, the clients built from them and the pieces built on those.
    Nothing here connects at build time."""

    settings: Settings
    lines: LineRegistry
    engine: Engine
    journal: Journal
    redis: redis.Redis
    pusher: Pusher
    http: httpx.Client
    alerts: Alerter
    telemetry: Telemetry
    acceptor: Acceptor
    circuits: CircuitReader
    attempts: AttemptEngine
    sweeper: Sweeper
    lost: LostMessages
    retention: Retention
    replayer: Replayer
    view: LineView
    monitor: Monitor
    firer: ScheduleFirer
    paused: PausedLines
    pauser: LinePauser
    # None when tracing is off (`app.telemetry.tracing`); the pieces hold `tracer`, its
    # tracer or the no-op one.
    tracer_provider: TracerProvider | None
    tracer: Tracer

    @classmethod
    def build(
        cls, settings: Settings, *, db_pool_size: int = 5, component: str = "pipeline"
    ) -> Runtime:
        """Resolve the lines and build the clients and pieces. `component` names the
        process's spans' service (`pipeline-intake`, `pipeline-worker`) when tracing is
        on. Raises `ConfigError` (a bad line, or tracing asked for without its SDK)."""
        lines = LineRegistry.from_settings(settings)
        provider = make_tracer_provider(
            settings.otel_endpoint,
            service=component if component == "pipeline" else f"pipeline-{component}",
        )
        tracer = provider.get_tracer(SCOPE) if provider is not None else NO_TRACER
        client = make_redis(settings.redis_url, redis_options(settings))
        telemetry = Telemetry(client)
        engine = make_engine(settings.database_url, pool_size=db_pool_size)
        journal = Journal(engine)
        pusher = Pusher(client, tracer=tracer)
        http = make_http_client()
        alerts = Alerter(settings, clock=utcnow, telemetry=telemetry)
        paused = PausedLines(journal)
        acceptor = Acceptor(
            journal=journal, pusher=pusher, alerts=alerts, lines=lines, paused=paused
        )
        circuits = CircuitReader(client)
        view = LineView(
            journal=journal,
            queues=pusher,
            redis=client,
            lines=lines,
            paused=paused,
            circuits=circuits,
        )
        return cls(
            settings=settings,
            lines=lines,
            engine=engine,
            journal=journal,
            redis=client,
            pusher=pusher,
            http=http,
            alerts=alerts,
            telemetry=telemetry,
            acceptor=acceptor,
            circuits=circuits,
            attempts=AttemptEngine(
                journal=journal,
                lines=lines,
                telemetry=telemetry,
                alerts=alerts,
                redis_url=settings.redis_url,
                redis_options=redis_options(settings),
                paused=paused,
                tracer=tracer,
                lease_s=settings.lease_seconds,
            ),
            sweeper=Sweeper(
                journal=journal,
                pusher=pusher,
                lines=lines,
                telemetry=telemetry,
                alerts=alerts,
                max_per_run=settings.sweep_max_per_run,
                batch_limit=settings.sweep_batch_size,
                received_grace_s=settings.received_grace_seconds,
                paused=paused,
                circuits=circuits,
            ),
            lost=LostMessages(
                journal=journal,
                pusher=pusher,
                lines=lines,
                telemetry=telemetry,
                alerts=alerts,
                quiet_s=settings.lost_after_seconds,
                paused=paused,
            ),
            retention=Retention(
                journal=journal,
                days=settings.retention_days,
                undelivered_days=settings.retention_undelivered_days,
                batch_size=settings.retention_batch_size,
                budget_s=settings.retention_max_run_seconds,
            ),
            replayer=Replayer(
                journal=journal, pusher=pusher, lines=lines, http=http, alerts=alerts
            ),
            view=view,
            monitor=Monitor(
                view=view,
                redis=client,
                alerts=alerts,
                backlog_after_s=settings.backlog_after_seconds,
            ),
            firer=ScheduleFirer(journal=journal, acceptor=acceptor),
            paused=paused,
            pauser=LinePauser(journal=journal, waiting=pusher.waiting, lines=lines, paused=paused),
            tracer_provider=provider,
            tracer=tracer,
        )

    def close(self) -> None:
        self.attempts.close()
        self.alerts.close()
        self.telemetry.close()
        self.http.close()
        self.redis.close()
        self.engine.dispose()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()  # exports what is waiting first
