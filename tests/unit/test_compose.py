"""compose.yaml runs real commands of this project with real settings.

No container engine runs here, so the file is parsed and checked (tests/support/
compose_check.py); the last tests feed the checkers broken files to show they can fail."""

from __future__ import annotations

import shlex

import pytest
from sqlalchemy.engine import make_url

import app.celery_app
from app.config.settings import DEFAULT_LINES
from app.errors import ConfigError
from tests.support.compose_check import (
    EXPECTED_SERVICES,
    ONE_SHOT_SERVICES,
    OPERATOR_ENV,
    argv_of,
    compose_problems,
    interpolate_tree,
    is_application,
    load_compose,
    named_volumes,
    parse_pipeline,
    pipeline_path,
    seconds,
    services,
    settings_for,
)


@pytest.fixture
def _fresh_default_celery(monkeypatch):
    """`celery -A app.celery_app` builds a default app from the environment once per
    process; the one the checker builds goes away after the test."""
    monkeypatch.setattr(app.celery_app, "_default", None)


@pytest.mark.usefixtures("_fresh_default_celery")
def test_compose_file_has_no_problems():
    assert compose_problems(load_compose(), OPERATOR_ENV) == []


def test_stack_has_every_service_and_each_but_the_migration_is_healthchecked():
    found = services()
    assert set(found) >= EXPECTED_SERVICES
    for name, service in found.items():
        has_check = "test" in (service.get("healthcheck") or {})
        assert has_check is (name not in ONE_SHOT_SERVICES), name
    assert found["migrate"]["restart"] == "no"
    assert pipeline_path(found["migrate"]) == ["pipeline", "db", "upgrade"]


def test_redis_keeps_an_append_only_file_and_never_evicts():
    compose = load_compose()
    redis = interpolate_tree(compose, OPERATOR_ENV)["services"]["redis"]
    command = shlex.join(argv_of(redis["command"]))
    assert "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command
    for name in ("redis", "postgres"):
        volumes = named_volumes(compose["services"][name])
        assert volumes, f"{name} keeps its data in a named volume"
        assert volumes <= set(compose["volumes"])


def test_one_worker_per_default_line_and_two_beats():
    found = services()
    worker_lines = []
    beats = []
    for name, service in found.items():
        path = pipeline_path(service)
        if path == ["pipeline", "worker"]:
            line = parse_pipeline(argv_of(service["command"])[1:])[1]["line"]
            worker_lines.append(line)
        elif path == ["pipeline", "beat"]:
            beats.append(name)
    assert sorted(worker_lines) == sorted(DEFAULT_LINES)
    assert len(beats) == 2


def test_every_application_service_environment_loads(monkeypatch):
    found = services()
    applications = {name: s for name, s in found.items() if is_application(s)}
    assert applications
    for name, service in applications.items():
        try:
            settings = settings_for(service, monkeypatch)
        except ConfigError as exc:
            pytest.fail(f"{name}: {exc}")
        assert not settings.dev_mode, f"{name}: dev mode would bind the intake to 127.0.0.1"
        # A SQLAlchemy URL whose dialect and driver are installed; nothing connects.
        make_url(settings.database_url).get_dialect()
        if pipeline_path(service) == ["pipeline", "worker"]:
            # SIGQUIT is Celery's cold shutdown, which is where its soft shutdown runs.
            assert service["stop_signal"] == "SIGQUIT", name
            grace_s = seconds(service["stop_grace_period"])
            assert grace_s >= 30, name
            assert grace_s > settings.worker_soft_shutdown_seconds + 10, name


def test_a_required_secret_left_unset_is_reported():
    environ = {k: v for k, v in OPERATOR_ENV.items() if k != "PIPELINE_ADMIN_TOKEN"}
    problems = compose_problems(load_compose(), environ)
    assert problems == ["compose refuses to start: PIPELINE_ADMIN_TOKEN: set PIPELINE_ADMIN_TOKEN"]


BROKEN_APP = {"build": ".", "healthcheck": {"test": ["CMD", "true"]}}


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        pytest.param(
            {
                **BROKEN_APP,
                "command": "pipeline beat",
                "environment": ["PIPELINE_NO_SUCH_SETTING=1"],
            },
            "app: PIPELINE_NO_SUCH_SETTING: no setting 'no_such_setting'",
            id="unknown-setting",
        ),
        pytest.param(
            {
                **BROKEN_APP,
                "command": "pipeline beat",
                "environment": {"PIPELINE_LINES__ORDER__SPEED": "3"},
            },
            "app: PIPELINE_LINES__ORDER__SPEED: no line setting 'speed'",
            id="unknown-line-setting",
        ),
        pytest.param(
            {**BROKEN_APP, "command": ["pipeline", "no-such-command"]},
            "app: command: pipeline no-such-command: no such command",
            id="unknown-command",
        ),
        pytest.param(
            {**BROKEN_APP, "command": ["pipeline", "worker", "order", "--bogus"]},
            "app: command: pipeline worker order --bogus: No such option: --bogus",
            id="unknown-option",
        ),
        pytest.param(
            {**BROKEN_APP, "command": ["pipeline", "worker", "shipment"]},
            "app: command: pipeline worker shipment: no such line "
            "(lines: ['order', 'refund', 'status'])",
            id="unknown-line",
        ),
        pytest.param(
            {
                **BROKEN_APP,
                "command": ["pipeline", "beat"],
                "healthcheck": {
                    "test": ["CMD", "celery", "-A", "app.celery_app", "inspect", "pong"]
                },
            },
            "app: healthcheck: celery inspect pong: not a remote inspect command",
            id="unknown-inspect-method",
        ),
        pytest.param(
            {
                **BROKEN_APP,
                "command": ["pipeline", "beat"],
                "healthcheck": {"test": ["CMD", "celery", "-A", "app.celery_app", "pingall"]},
            },
            "app: healthcheck: celery pingall: no such command",
            id="unknown-celery-command",
        ),
        pytest.param(
            {
                **BROKEN_APP,
                "command": ["pipeline", "beat"],
                "healthcheck": {"test": ["CMD", "echo", "order@$$HOSTNAME"]},
            },
            "app: healthcheck: CMD passes $VARIABLES unexpanded",
            id="variable-in-exec-form",
        ),
        pytest.param(
            {"image": "redis:7-alpine", "volumes": ["lost:/data"]},
            "app: volume 'lost' is not declared under volumes:",
            id="undeclared-volume",
        ),
        pytest.param({"image": "redis:7-alpine"}, "app: no healthcheck", id="no-healthcheck"),
        pytest.param(
            {
                **BROKEN_APP,
                "command": ["pipeline", "beat"],
                "healthcheck": {"test": ["CMD", "python", "-c", "import os from sys import path"]},
            },
            "app: healthcheck: python -c: invalid syntax (line 1)",
            id="python-syntax-error",
        ),
        pytest.param(
            {
                **BROKEN_APP,
                "command": ["pipeline", "beat"],
                "healthcheck": {
                    "test": ["CMD", "python", "-c", "from app.redis_client import make_redis"]
                },
            },
            "app: healthcheck: python -c: no module app.redis_client",
            id="python-module-moved",
        ),
        pytest.param(
            {
                **BROKEN_APP,
                "command": ["pipeline", "beat"],
                "healthcheck": {
                    "test": ["CMD", "python", "-c", "from app.config.redis import redis_options"]
                },
            },
            "app: healthcheck: python -c: app.config.redis has no redis_options",
            id="python-name-moved",
        ),
        pytest.param(
            {
                **BROKEN_APP,
                "command": ["pipeline", "worker", "refund"],
                "healthcheck": {
                    "test": [
                        "CMD-SHELL",
                        "celery -A app.celery_app inspect ping -d order@$$HOSTNAME -t 5",
                    ]
                },
            },
            "app: healthcheck: pings ['order@$HOSTNAME'], not this worker "
            "(refund@$HOSTNAME in a shell)",
            id="ping-to-another-worker",
        ),
    ],
)
@pytest.mark.usefixtures("_fresh_default_celery")
def test_the_checker_reports_a_broken_service(service, expected):
    problems = compose_problems({"services": {"app": service}}, {})
    assert expected in problems, problems


def test_a_service_environment_with_a_bad_value_does_not_load(monkeypatch):
    service = {**services()["intake"]}
    service["environment"] = {**service["environment"], "PIPELINE_REDIS_URL": "http://redis:6379/0"}
    with pytest.raises(ConfigError, match="PIPELINE_REDIS_URL"):
        settings_for(service, monkeypatch)


@pytest.mark.usefixtures("_fresh_default_celery")
def test_the_sentinel_profile_adds_a_replica_and_three_sentinels_the_url_points_at(monkeypatch):
    environ = dict(
        OPERATOR_ENV,
        REDIS_SCHEME="sentinel",
        REDIS_ADDRESS="sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/0?master=pipeline",
    )
    assert compose_problems(load_compose(), environ) == []
    found = interpolate_tree(load_compose(), environ)["services"]
    in_profile = {name for name, service in found.items() if service.get("profiles")}
    assert in_profile == {"redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"}
    assert all(found[name]["profiles"] == ["sentinel"] for name in in_profile)
    replica = shlex.join(argv_of(found["redis-replica"]["command"]))
    assert "--replicaof redis 6379" in replica
    for name in ("sentinel-1", "sentinel-2", "sentinel-3"):
        script = found[name]["command"][-1]
        assert "sentinel monitor pipeline redis 6379 2" in script
        assert script.endswith("exec redis-server /tmp/sentinel.conf --sentinel")
    url = settings_for(found["intake"], monkeypatch).redis_url
    assert url == (
        "sentinel://:change-me@sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/0?master=pipeline"
    )
    # Without the two variables, the one Redis as before.
    default = services()["intake"]
    assert settings_for(default, monkeypatch).redis_url == "redis://:change-me@redis:6379/0"
