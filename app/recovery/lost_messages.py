"""Messages Redis lost in part: found by looking, pushed again.

The epoch (`app.admission.push`) tells when Redis lost everything. A partial loss leaves the
epoch: a failover to a replica that lagged, the last second of an append-only file, a
message acked by a hard time limit, a single message removed by hand, a sweeper killed
between its claim and its push. Run by the active beat every
`lost_check_interval_seconds`: per line, every record whose message should be waiting
(enqueued in this epoch or claimed for a push, no attempt since, unchanged for
`lost_after_seconds`), read from the journal in pages, is compared with what the line's
queue and kombu's unacked messages hold, read in slices (`app.admission.ledger.Ledger.scan`);
those whose message is in neither are claimed, if no attempt took them meanwhile, and pushed
again. A record whose message is only waiting, however long the queue, is seen there and
never pushed twice. The same scan recounts the line's records (`Ledger.forget_unseen`).
Redis is read only when some record has waited that long or the line counts records on its
queue. A paused line is passed over until its resume.

A record whose message was being taken by a worker at the moment of the read (between
kombu's fetch and its bookkeeping) may be pushed twice: its second message finds it in
flight or done, and runs nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.admission.pause import PausedLines
from app.admission.push import Pusher
from app.errors import BrokerUnavailable
from app.journal import claims
from app.journal.journal import Journal
from app.lines import Line, LineRegistry
from app.recovery.sweeper import push_claimed
from app.telemetry.alerts import Alerter
from app.telemetry.counters import Counter, Telemetry
from app.telemetry.events import Event
from app.telemetry.logs import get_logger

log = get_logger(__name__)

# Suspects read from the journal at a time, oldest first: every one of them is checked.
SUSPECTS_PAGE = 20_000


@dataclass(frozen=True, kw_only=True)
class LostMessages:
    """Finds the records whose message Redis lost in part, and pushes them again."""

    journal: Journal
    pusher: Pusher
    lines: LineRegistry
    telemetry: Telemetry
    alerts: Alerter
    # A record whose message should be waiting, unchanged this long, is looked for.
    quiet_s: float
    # A paused line's records are not pushed (the sweeper's after the resume).
    paused: PausedLines | None = None

    def recover_lost(self, *, now: datetime) -> dict[str, int]:
        """Push again, per line, the records whose message Redis lost. Returns how many per
        line. Raises `JournalUnavailable`; a Redis that does not answer ends the check (the
        next one tries again)."""
        recovered: dict[str, int] = {}
        try:
            epoch = self.pusher.epoch()
            for line in self.lines:
                count = self._recover_line(line, epoch=epoch, now=now)
                if count:
                    recovered[line.name] = count
        except BrokerUnavailable as exc:
            log.warning("lost_check_broker_down", error=str(exc))
        for line_name, count in recovered.items():
            self.telemetry.count(Counter.SWEEP_RECOVERED, count, line=line_name)
            self.alerts.raise_event(
                Event.RECOVERED,
                line=line_name,
                message=f"{count} messages of {line_name!r} were missing from Redis and were "
                "pushed again",
                count_recovered=count,
                partial=True,
            )
        return recovered

    def _recover_line(self, line: Line, *, epoch: str, now: datetime) -> int:
        if self.paused is not None and self.paused.is_paused(line.name):
            return 0
        ledger = self.pusher.ledger
        if ledger.recount_senders(line.queue):
            log.warning("sender_counts_corrected", line=line.name)
        with self.journal.reading() as conn:
            suspects = claims.waiting_suspects(
                conn, line=line.name, epoch=epoch, now=now, quiet_s=self.quiet_s, limit=1
            )
        if not suspects and ledger.records(line.queue) == 0:
            return 0
        seen = ledger.scan(line.queue)
        forgotten = ledger.forget_unseen(line.queue, seen)
        if forgotten:
            log.warning("queue_count_corrected", line=line.name, records=forgotten)
        missing = self._missing(line, seen.ids, epoch=epoch, now=now)
        if not missing:
            return 0
        with self.journal.transaction() as conn:
            claimed = claims.claim_lost(conn, missing, epoch=epoch, now=now, quiet_s=self.quiet_s)
        if not claimed:
            return 0
        pushed = push_claimed(self.journal, self.pusher, line, claimed, now=now)
        log.warning(
            "lost_messages_pushed_again",
            line=line.name,
            missing=len(missing),
            pushed=len(pushed),
            first_id=claimed[0].id,
        )
        return len(pushed)

    def _missing(self, line: Line, present: set[str], *, epoch: str, now: datetime) -> list[str]:
        """The line's suspects, every one, read in pages, whose message is not `present`.
        The scan came first: a record enqueued after it is not a suspect yet (it has not
        been quiet for `quiet_s`)."""
        missing: list[str] = []
        after: str | None = None
        while True:
            with self.journal.reading() as conn:
                page = claims.waiting_suspects(
                    conn,
                    line=line.name,
                    epoch=epoch,
                    now=now,
                    quiet_s=self.quiet_s,
                    limit=SUSPECTS_PAGE,
                    after=after,
                )
            missing += [record_id for record_id in page if record_id not in present]
            if len(page) < SUSPECTS_PAGE:
                return missing
            after = page[-1]
