"""`python -m app.cli …`: the `pipeline` command, as the supervisor and the tests start it."""

from __future__ import annotations

from app.cli.main import main

main()
