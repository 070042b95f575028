"""Two intake processes journaling the same signed requests at once, in groups that hold
them in different orders (clients retrying several records through a load balancer): each
request is one record, and neither group fails."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from app.admission.accept import Acceptance
from app.clock import utcnow
from app.ids import new_id
from app.journal.models import Source
from app.journal.store import NewRecord

# Runs on every journal database; the interleaving below needs PostgreSQL.
pytestmark = pytest.mark.journal

# Each row's insert waits this long first, so that two groups started together are each
# half-way through when they reach the other's row.
ROW_DELAY_S = 0.3
SLOW_INSERTS = f"""
CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep({ROW_DELAY_S}); RETURN NEW; END $$;
CREATE TRIGGER slow_insert BEFORE INSERT ON records
    FOR EACH ROW EXECUTE FUNCTION slow_insert();
"""


def _sent(keys: list[str]) -> list[NewRecord]:
    """The group an intake forms from requests carrying these nonces, in this order."""
    now = utcnow()
    return [
        NewRecord(
            id=new_id(now),
            line="order",
            business_no=key,
            source=Source.INTAKE,
            dedup_key=f"shop-1:{key}",
            body_sha256="3" * 64,
            payload={"business_no": key},
        )
        for key in keys
    ]


def test_two_intakes_journaling_the_same_requests_in_other_orders_make_one_record_each(
    harness, database_url
):
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only: SQLite takes one writer at a time, so groups never meet")
    first, second = harness.runtime(), harness.runtime()  # two intakes' pools of connections
    with first.engine.begin() as conn:
        conn.exec_driver_sql(SLOW_INSERTS)
    groups = {"first": _sent(["n-1", "n-2"]), "second": _sent(["n-2", "n-1"])}
    start = threading.Barrier(2)
    outcomes: dict[str, list[Acceptance] | BaseException] = {}

    def accept(name: str, rt) -> None:
        start.wait(timeout=10)
        try:
            outcomes[name] = rt.acceptor.accept_many(groups[name], clock=utcnow)
        except Exception as exc:  # noqa: BLE001 - the test reports what either group raised
            outcomes[name] = exc

    threads = [
        threading.Thread(target=accept, args=(name, rt))
        for name, rt in (("first", first), ("second", second))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    failed = {
        name: f"{o!r}, from {type(o.__cause__).__name__}: {o.__cause__}".splitlines()[0]
        for name, o in outcomes.items()
        if isinstance(o, BaseException)
    }
    assert failed == {}
    with first.engine.connect() as conn:
        stored = dict(conn.execute(text("SELECT dedup_key, id FROM records")).all())
    assert sorted(stored) == ["shop-1:n-1", "shop-1:n-2"]
    # Every answer names the one record of its request, and each record was created once.
    created = []
    for name, accepted in outcomes.items():
        assert not isinstance(accepted, BaseException)
        for new, acceptance in zip(groups[name], accepted, strict=True):
            assert acceptance.record.id == stored[new.dedup_key]
            if acceptance.created:
                created.append(acceptance.record.id)
    assert sorted(created) == sorted(stored.values())
