"""Fixtures: a real Redis-compatible server, a clean journal database per test (SQLite by
default, PostgreSQL when PIPELINE_TEST_DATABASE_URL names a server), and the harness."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from app.journal.engine import make_engine
from app.journal.schema import upgrade
from app.local.embedded_redis import RedisServer
from tests.support import run_groups
from tests.support.harness import Harness
from tests.support.processes import free_port

# Set by .ci/run to a PostgreSQL server's maintenance database, e.g.
# postgresql+psycopg://postgres@127.0.0.1:5432/postgres. Unset: SQLite.
PG_ADMIN_URL = os.environ.get("PIPELINE_TEST_DATABASE_URL", "")

TESTS_DIR = Path(__file__).resolve().parent
# Each directory of tests/ is a tier, with the marker of its name (see pyproject.toml).
TIERS = ("unit", "integration", "chaos", "browser")
# The controller's directory for the workers' groups (see tests/support/run_groups.py).
_GROUPS_DIR = pytest.StashKey[Path]()


def mark_tiers(items: list[pytest.Item]) -> None:
    """Mark each test with its tier, the directory it is in: tests/<tier>/..."""
    for item in items:
        try:
            tier = item.path.resolve().relative_to(TESTS_DIR).parts[0]
        except ValueError:
            continue
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


def _run_group(item: pytest.Item) -> str | None:
    """Which tests run one after another on one process under `pytest -n N` (pyproject's
    `--dist loadgroup`): those that load the machine (two at once would test the machine,
    not the pipeline), and the tests of a module that share a module's fixture (set up
    once, on one process). None: the test goes alone to whichever process is free."""
    if item.get_closest_marker("loads_machine"):
        return "loads_machine"
    # The fixtures the test uses, with their scopes (pytest has no public name for them).
    info = getattr(item, "_fixtureinfo", None)
    shared = info is not None and any(
        definition.scope in ("package", "module", "class")
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )
    return item.path.stem if shared else None


def pytest_configure(config: pytest.Config) -> None:
    """On the controller of `pytest -n N --dist loadgroup`: a directory for the groups."""
    distributed = config.getoption("dist", "no") == "loadgroup" and config.getoption("tx", [])
    if distributed and not hasattr(config, "workerinput"):
        config.stash[_GROUPS_DIR] = Path(tempfile.mkdtemp(prefix="pytest-run-groups-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    groups_dir = config.stash.get(_GROUPS_DIR, None)
    if groups_dir is not None:
        shutil.rmtree(groups_dir, ignore_errors=True)


def pytest_configure_node(node: Any) -> None:
    """On the controller of `pytest -n N`: where each worker writes its tests' groups."""
    groups_dir = node.config.stash.get(_GROUPS_DIR, None)
    if groups_dir is not None:
        node.workerinput[run_groups.GROUPS_DIR] = str(groups_dir)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` by the groups of `_run_group` (see tests/support/run_groups.py)."""
    groups_dir = config.stash.get(_GROUPS_DIR, None)
    if groups_dir is None:
        return None
    return run_groups.RunGroupScheduling(config, log, groups_dir=groups_dir)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier. On PostgreSQL, run what is marked `journal` (it
    exercises the journal's database: its statements, transactions and failures) and skip
    the rest, with the reason printed: it has run in the SQLite pass, through the same
    journal code."""
    mark_tiers(items)
    if hasattr(config, "workerinput"):
        # A process of `pytest -n N` (they collect, the controller hands out): the tests
        # that load the machine go first, one after another on one process, and the `long`
        # ones, so that no process waits alone for them at the end; the others take the
        # rest meanwhile.
        items.sort(
            key=lambda item: (
                item.get_closest_marker("loads_machine") is None,
                item.get_closest_marker("long") is None,
            )
        )
        groups = {item.nodeid: group for item in items if (group := _run_group(item))}
        run_groups.write_groups(config, groups)
    if not PG_ADMIN_URL:
        return
    once = pytest.mark.skip(
        reason="runs once, in the SQLite pass: what it checks does not depend on the "
        "journal's database"
    )
    for item in items:
        if item.get_closest_marker("journal_independent") or not item.get_closest_marker("journal"):
            item.add_marker(once)


def pytest_report_header() -> str:
    backend = make_url(PG_ADMIN_URL).render_as_string() if PG_ADMIN_URL else "sqlite"
    return f"journal database: {backend}"


def _drop_pipeline_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PIPELINE_") and not name.startswith("PIPELINE_TEST_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No PIPELINE_ setting of the shell leaks into a test."""
    _drop_pipeline_settings(monkeypatch)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(port=free_port(), workdir=tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _emptied(redis_server: RedisServer) -> str:
    client = redis_server.client()
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server.url


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """A Redis with nothing in it."""
    return _emptied(redis_server)


# Admin engines connect afresh each time: a test may restart the server in between.
@pytest.fixture(scope="session")
def _template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated database that each test's database is copied from."""
    if not PG_ADMIN_URL:
        path = tmp_path_factory.mktemp("journal") / "template.db"
        engine = make_engine(f"sqlite:///{path}")
        upgrade(engine)
        engine.dispose()  # the last connection to close checkpoints the WAL into the file
        yield str(path)
        return
    name = f"pipeline_tpl_{os.getpid()}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = make_engine(make_url(PG_ADMIN_URL).set(database=name).render_as_string(False))
    upgrade(engine)
    engine.dispose()
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def _fresh_database(template: str, directory: Path) -> Iterator[str]:
    """A freshly migrated, empty journal database, copied from `template`; dropped after."""
    if not PG_ADMIN_URL:
        path = directory / "journal.db"
        shutil.copyfile(template, path)
        yield f"sqlite:///{path}"
        return
    name = f"pipeline_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def database_url(_template: str, tmp_path: Path) -> Iterator[str]:
    """A freshly migrated, empty journal database for this test."""
    with _fresh_database(_template, tmp_path) as url:
        yield url


@contextlib.contextmanager
def _running_harness(
    database_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Harness]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not (name.startswith("PIPELINE_") and not name.startswith("PIPELINE_TEST_"))
    }
    env.update(
        PIPELINE_DATABASE_URL=database_url,
        PIPELINE_REDIS_URL=redis_url,
        PIPELINE_SWEEP_INTERVAL_SECONDS="0.5",
        PIPELINE_RECEIVED_GRACE_SECONDS="1",
        PIPELINE_LOG_LEVEL="INFO",
        # Without keys the intake starts only in dev mode; a test that sets keys signs.
        PIPELINE_DEV_MODE="true",
    )
    h = Harness(env=env, tmp_path=tmp_path, monkeypatch=monkeypatch)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def harness(
    database_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Harness]:
    with _running_harness(database_url, redis_url, tmp_path, monkeypatch) as h:
        yield h


@pytest.fixture(scope="module")
def module_harness(
    request: pytest.FixtureRequest,
    _template: str,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Harness]:
    """One harness, database and empty Redis for all the tests of a module: for a stack
    that takes long to start and that those tests only read, set up once for all of them.

    Each test starts with no PIPELINE_ setting in its environment (`_clean_environment`):
    it uses what the set-up built (clients, runtimes), or sets `harness.env` again."""
    tmp_path = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])
    with pytest.MonkeyPatch.context() as monkeypatch:
        _drop_pipeline_settings(monkeypatch)
        with (
            _fresh_database(_template, tmp_path) as database_url,
            _running_harness(database_url, _emptied(redis_server), tmp_path, monkeypatch) as h,
        ):
            yield h
