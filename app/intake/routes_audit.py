"""`GET /v1/audit`: the audit log, newest first, a page at a time (admin)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import AfterValidator

from app.ids import is_id
from app.intake.admin import require_admin
from app.intake.routes import ADMIN, RuntimeDep, Text, errors_doc
from app.journal import audit

router = APIRouter()

# Rows a page holds unless asked, and at most.
DEFAULT_PAGE = 100
MAX_PAGE = 1000


def _cursor(value: str) -> str:
    if not is_id(value):
        raise ValueError("not a cursor of the audit log (pass the `next` of a page)")
    return value


Cursor = Annotated[str, AfterValidator(_cursor)]


@router.get("/v1/audit", dependencies=[Depends(require_admin)], responses=errors_doc(*ADMIN))
def list_audit(
    rt: RuntimeDep,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    after: Annotated[Cursor | None, Query(description="The `next` of the page before.")] = None,
    target: Annotated[
        Text | None,
        Query(
            min_length=1,
            max_length=256,
            description="Only the rows about this target: `record:<id>`, `line:<name>`, "
            "`schedule:<name>`.",
        ),
    ] = None,
) -> dict[str, Any]:
    """Operator actions, newest first: who did what to which records, lines or schedules,
    with what parameters and result, and why; `target`: only those about one of them.
    `next` is the cursor of the following (older) page, null on the last."""
    with rt.journal.reading() as conn:
        entries = audit.newest(conn, limit=limit + 1, before=after, target=target)
    page = entries[:limit]
    return {
        "items": [entry.public() for entry in page],
        "next": page[-1].id if len(entries) > limit else None,
    }
