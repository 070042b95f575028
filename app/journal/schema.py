"""Schema migrations (Alembic), run by `pipeline db upgrade` and `pipeline up`."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text

SCRIPT_LOCATION = "app.journal:migrations"


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the journal's schema to `revision` (the newest by default)."""
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # An index built over a large journal may take longer than a journal session's
            # statement timeout, and may wait for the locks of running components; a
            # migration's own steps in Python between statements may take a while too.
            conn.execute(text("SET LOCAL statement_timeout = 0"))
            conn.execute(text("SET LOCAL lock_timeout = 0"))
            conn.execute(text("SET LOCAL idle_in_transaction_session_timeout = 0"))
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
