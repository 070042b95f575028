"""`Runtime`: what a process of the pipeline holds, built once at its entry point."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import redis
from sqlalchemy import Engine

from app.clock import utcnow
from app.delivery.push import Admission
from app.delivery.sinks import make_http_client
from app.journal.engine import make_engine
from app.journal.journal import Journal
from app.lines import LineRegistry
from app.observe.alerts import Alerter
from app.observe.telemetry import Telemetry
from app.redis_client import make_redis, redis_options
from app.settings import Settings


@dataclass(frozen=True, kw_only=True)
class Runtime:
    """Settings, lines and the clients built from them. Nothing here connects at build time."""

    settings: Settings
    lines: LineRegistry
    engine: Engine
    journal: Journal
    redis: redis.Redis
    admission: Admission
    http: httpx.Client
    alerts: Alerter
    telemetry: Telemetry

    @classmethod
    def build(cls, settings: Settings, *, db_pool_size: int = 5) -> Runtime:
        """Resolve the lines (raises `ConfigError`) and build the clients."""
        lines = LineRegistry.from_settings(settings)
        client = make_redis(settings.redis_url, redis_options(settings))
        telemetry = Telemetry(client)
        engine = make_engine(settings.database_url, pool_size=db_pool_size)
        return cls(
            settings=settings,
            lines=lines,
            engine=engine,
            journal=Journal(engine),
            redis=client,
            admission=Admission(client),
            http=make_http_client(),
            alerts=Alerter(settings, clock=utcnow, telemetry=telemetry),
            telemetry=telemetry,
        )

    def close(self) -> None:
        self.alerts.close()
        self.telemetry.close()
        self.http.close()
        self.redis.close()
        self.engine.dispose()
