"""`create_celery(settings)`: the Celery app of the pipeline.

`celery -A app.celery_app worker -Q order` works too: the module builds a default app from
the environment the first time `app` (or `celery`) is read, never at import."""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu.entity import Queue

from app.admission.push import TASK_NAME
from app.config.redis import kombu_broker
from app.config.settings import BRPOP_TIMEOUT_S, Settings, load_settings, redis_options
from app.errors import ConfigError, UnboundedPublish

# Celery finds the task modules by name: app/ never imports workers/ or beat/.
TASK_MODULES = ["workers.tasks"]
BEAT_SCHEDULER = "beat.scheduler:PipelineScheduler"


class PipelineCelery(Celery):
    """A Celery app that carries the pipeline's settings.

    Publishing the pipeline's task through Celery (`send_task`, and so `apply_async`, which
    calls it) raises `UnboundedPublish`: those messages go through `app.admission.push`, whose
    push checks the line's bound atomically; Celery's path would skip it."""

    pipeline_settings: Settings

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == TASK_NAME:
            raise UnboundedPublish()
        return super().send_task(name, *args, **kwargs)


def create_celery(settings: Settings) -> PipelineCelery:
    """Build the Celery app for `settings`. Connects to nothing."""
    celery = PipelineCelery("pipeline", set_as_current=False)
    celery.pipeline_settings = settings
    options = redis_options(settings)
    # A sentinel URL becomes kombu's: one URL per sentinel, the primary's name an option.
    broker_url, sentinel_options = kombu_broker(settings.redis_url, options)
    celery.conf.update(
        broker_url=broker_url,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=settings.redis_connect_timeout_seconds or None,
        broker_heartbeat=0,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_seconds,
            **options,
            "brpop_timeout": BRPOP_TIMEOUT_S,
            # kombu returns a dead worker's unacked messages only when a sweep finds them
            # past the visibility timeout; its default sweep runs every 10 x 10 s.
            "unacked_restore_interval": max(1, min(10, settings.visibility_timeout_seconds // 4)),
            "unacked_restore_throttle": 1,
            **sentinel_options,
        },
        result_backend=None,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        # A handler must end before kombu hands its message to another worker.
        task_time_limit=max(1, int(settings.visibility_timeout_seconds * 0.9)),
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # Task events stay off by default: Flower turns them on in the workers while it runs
        # (its enable_events broadcast), so its task view works. Always on, they stalled a
        # worker's consumer for ~90 s behind a proxy that drops idle connections silently
        # (tests/chaos/test_proxy.py): the event publisher's idle connection was the one lost.
        worker_send_task_events=False,
        task_queues=[Queue(name, routing_key=name) for name in settings.lines],
        task_routes={TASK_NAME: {"queue": next(iter(settings.lines), "order")}},
        task_create_missing_queues=False,
        include=TASK_MODULES,
        beat_scheduler=BEAT_SCHEDULER,
        beat_max_loop_interval=1,
        worker_hijack_root_logger=False,
        worker_soft_shutdown_timeout=settings.worker_soft_shutdown_seconds,
        worker_enable_soft_shutdown_on_idle=False,  # no ETA tasks to hand back when idle
        worker_redirect_stdouts=False,
        timezone="UTC",
        enable_utc=True,
    )
    return celery


def pipeline_settings(app: Celery) -> Settings:
    """The settings `app` was built with. Raises `ConfigError` for an app that is not the
    pipeline's (a worker or beat started with another `-A`)."""
    if not isinstance(app, PipelineCelery):
        raise ConfigError(f"the Celery app {app.main!r} is not the pipeline's (app.celery_app)")
    return app.pipeline_settings


_default: PipelineCelery | None = None


def __getattr__(name: str) -> Any:
    """Build the default app from the environment on first use (for `celery -A`)."""
    global _default  # noqa: PLW0603 - one lazily built app per process, for the celery CLI
    if name in ("app", "celery"):
        if _default is None:
            _default = create_celery(load_settings())
        return _default
    raise AttributeError(name)
