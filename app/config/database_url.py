"""Which journal URLs can work: SQLite in a file, or PostgreSQL through a synchronous driver
that is installed. Checked when the settings are read, so a URL that cannot work stops
every command at its start with one line naming `PIPELINE_DATABASE_URL`, before anything
tries to connect."""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

# What a user can copy: the embedded default, and the production store.
EXAMPLES = "sqlite:///./pipeline.db or postgresql+psycopg://user:password@host:5432/pipeline"
# The databases the journal's statements are written for (app.journal.store upserts in
# their dialects).
BACKENDS = ("sqlite", "postgresql")
# SQLite names for a database that lives in memory only: not durable.
_IN_MEMORY = ("", ":memory:")


def database_url_problem(url: str) -> str | None:
    """Why `url` cannot be the journal, as a sentence that never repeats the URL (it may
    hold a password); None when it can. Loads the dialect and imports its driver, but
    touches no database: one that does not answer (a server down, a SQLite file that cannot
    be opened yet) is an outage the components run through, not a setting to refuse."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return f"cannot be read as a database URL; use {EXAMPLES}"
    backend, _, driver = parsed.drivername.partition("+")
    if backend not in BACKENDS:
        return f"the database {backend!r} is not supported; use {EXAMPLES}"
    problem = _driver_problem(parsed, backend=backend, driver=driver)
    if problem is not None:
        return problem
    if backend == "sqlite" and _in_memory(parsed):
        return (
            "an in-memory SQLite journal loses every record when the process stops; "
            "name a file, e.g. sqlite:///./pipeline.db"
        )
    return None


def _driver_problem(parsed: URL, *, backend: str, driver: str) -> str | None:
    named = f"the driver {driver!r}" if driver else f"{backend}'s default driver"
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        return f"{backend} has no driver {driver!r}; use {EXAMPLES}"
    if getattr(dialect, "is_async", False):
        return f"{named} is asynchronous; the journal needs a synchronous one: use {EXAMPLES}"
    try:
        dialect.import_dbapi()
    except ImportError:
        return f"{named} ({dialect.driver}) is not installed; use {EXAMPLES}"
    return None


def _in_memory(parsed: URL) -> bool:
    database = parsed.database or ""
    return database in _IN_MEMORY or parsed.query.get("mode") == "memory"


def check_database_url(url: str) -> str:
    """`url` when it can be the journal; raises `ValueError` saying why not."""
    problem = database_url_problem(url)
    if problem is not None:
        raise ValueError(problem)
    return url
