"""Which database URLs can be the journal, and what the refusal says."""

from __future__ import annotations

import pytest

from app.config.database_url import database_url_problem
from app.config.settings import load_settings
from app.errors import ConfigError


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///./pipeline.db",
        "sqlite+pysqlite:///pipeline.db",
        "postgresql+psycopg://app:pw@db:5432/pipeline",
        "postgresql+psycopg://app@db/pipeline?options=-c%20work_mem%3D8MB",
    ],
)
def test_a_url_that_can_work_passes(url):
    assert database_url_problem(url) is None


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("", "cannot be read as a database URL"),
        ("pipeline.db", "cannot be read as a database URL"),
        ("postgresql://app:secret@db:port/pipeline", "cannot be read as a database URL"),
        ("mysql://app@db/pipeline", "the database 'mysql' is not supported"),
        ("postgresql+nosuch://app@db/pipeline", "postgresql has no driver 'nosuch'"),
        ("postgresql+asyncpg://app@db/pipeline", "asynchronous"),
        ("sqlite+aiosqlite:///pipeline.db", "asynchronous"),
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
    ],
)
def test_a_url_that_cannot_work_is_said_why_without_its_password(url, said):
    problem = database_url_problem(url)
    assert problem is not None
    assert said in problem
    assert "secret" not in problem


def test_the_settings_refuse_it_naming_the_variable(monkeypatch):
    monkeypatch.setenv("PIPELINE_DATABASE_URL", "mysql://app:secret@db/pipeline")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith("PIPELINE_DATABASE_URL: the database 'mysql' is not supported")
    assert "\n" not in message
    assert "secret" not in message
