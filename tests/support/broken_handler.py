"""A line handler whose module cannot be imported: it needs a package that is not installed
(what a handler's operator sees must name that package)."""

from __future__ import annotations

import not_installed_dependency  # type: ignore[import-not-found]  # noqa: F401


def handle(record: object) -> None:
    """Never called: the module fails to import."""
