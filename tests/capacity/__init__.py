"""The capacity tooling behind docs/capacity.md (`python -m tests.capacity`, from the
checkout): measurements of the journal, Redis, a worker and the intake, and the arithmetic
that carries them to a daily volume. Kept out of the wheel: no user runs it. Not a tier of
tests (pytest collects nothing here): tests/unit/test_capacity_paper.py and
tests/integration/test_capacity.py run it."""
