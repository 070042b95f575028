"""`Journal`: the one door to the journal's database. Its transactions turn any database
error into `JournalUnavailable`, in this one place; the SQL itself is in
`app.journal.store` and `app.journal.attempts`, whose functions take the connection a
transaction gives and never commit (the caller owns the transaction)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from app.errors import JournalUnavailable
from app.journal.engine import read_only


class Journal:
    """Transactions on the journal's engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextmanager
    def transaction(self, what: str = "journal write") -> Iterator[Connection]:
        """A transaction, committed when the block ends and rolled back if it raises.

        Raises `JournalUnavailable` ("<what> failed: …") for any database error, whether
        it comes from the connection, a statement or the commit."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise JournalUnavailable(f"{what} failed: {type(exc).__name__}") from exc

    @contextmanager
    def reading(self, what: str = "journal read") -> Iterator[Connection]:
        """A connection whose transaction only reads, rolled back when the block ends. It
        takes no write lock and holds up no writer (on SQLite it sees the journal as it was
        when its first statement ran); a write in it fails.

        Raises `JournalUnavailable` for any database error, a refused write among them."""
        try:
            with self.engine.connect() as conn:
                read_only(conn)
                yield conn
        except SQLAlchemyError as exc:
            raise JournalUnavailable(f"{what} failed: {type(exc).__name__}") from exc
