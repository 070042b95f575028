"""What downstream already has, asked before a replay puts records back on their queues:
a table sink's rows (written by the record, or holding the same payload; a status no
newer than the one stored), or a line's check URL. A custom handler cannot tell."""

from __future__ import annotations

import urllib.parse

import httpx

from app.config.sink_settings import CHECK_URL_ID, SinkKind
from app.delivery.sinks import (
    ORDER_STATUS_TABLE,
    newest_statuses,
    payload_occurred_at,
    stored_rows,
)
from app.journal import store
from app.journal.journal import Journal
from app.journal.store import RecordKey
from app.lines import Line


def downstream_has(
    journal: Journal, http: httpx.Client, line: Line, batch: list[RecordKey]
) -> set[str]:
    """Ids of the records of `batch` (all of `line`) whose effect downstream already has."""
    if line.sink.kind is SinkKind.HANDLER:
        return set()  # a custom handler has no way to tell: replay it (it is idempotent)
    if line.sink.kind is SinkKind.HTTP:
        template = line.settings.check_url
        return {r.id for r in batch if template and _http_has(http, template, r)}
    table = line.sink_table
    business_nos = list({r.business_no for r in batch})
    with journal.reading() as conn:
        if table == ORDER_STATUS_TABLE:
            newest = newest_statuses(conn, business_nos)
            known = [r for r in batch if r.business_no in newest]
            found = store.payloads(conn, [r.id for r in known])
            return {
                r.id
                for r in known
                if r.id in found and newest[r.business_no] >= payload_occurred_at(found[r.id])
            }
        stored = stored_rows(conn, table=table, line=line.name, business_nos=business_nos)
        # Downstream has a record when its row was written by it, or holds the same
        # payload; a row of another record with other content does not count. Payloads
        # are read only for the records that need the comparison.
        known = [r for r in batch if r.business_no in stored]
        written_by = {r.id for r in known if stored[r.business_no][0] == r.id}
        found = store.payloads(conn, [r.id for r in known if r.id not in written_by])
    return written_by | {
        r.id for r in known if r.id in found and stored[r.business_no][1] == found[r.id]
    }


def _http_has(client: httpx.Client, template: str, record: RecordKey) -> bool:
    """Whether the line's check URL says downstream has `record`, asked by its id."""
    url = template.replace(CHECK_URL_ID, urllib.parse.quote(record.id, safe="")).replace(
        "{business_no}", urllib.parse.quote(record.business_no, safe="")
    )
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False  # cannot tell: replay it (the sink is idempotent)
