"""The sweeper: puts back on their queue the records that should be there.

Run by the active beat, in its own process, every few seconds. Per line, and only as far
as the line has room, it claims (`… → enqueued`) in one transaction the records that are
due: `received` unchanged for the grace period, `deferred`, `failed` with their retry
due, `enqueued` ones that can no longer be on the queue (Redis lost its memory: another
epoch; a message lost alone is `app.recovery.lost_messages`'s), and those whose
attempt's lease expired without an outcome. None in flight (a live lease) is pushed.
Thresholds are on the database's clock. Then one pipelined push per batch; what was not
pushed is put back as it was. Two sweepers at once never lose or double-claim a record.
A paused line (`app.admission.pause`) is passed over: what waits keeps its place."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from app.admission.pause import PausedLines
from app.admission.push import Pusher
from app.delivery.circuit import CircuitReader, State
from app.errors import BrokerUnavailable
from app.journal import claims
from app.journal.claims import Senders
from app.journal.journal import Journal
from app.journal.models import Record, RecordStatus
from app.lines import Line, LineRegistry
from app.telemetry.alerts import Alerter
from app.telemetry.counters import Counter, Telemetry
from app.telemetry.events import Event
from app.telemetry.logs import get_logger

log = get_logger(__name__)


@dataclass(kw_only=True)
class SweepResult:
    """What one sweep did, per line."""

    enqueued: dict[str, int] = field(default_factory=dict)
    recovered: dict[str, int] = field(default_factory=dict)
    broker_down: bool = False


@dataclass(frozen=True, kw_only=True)
class Sweeper:
    """Puts back on their queues the records that should be there (one pass: `sweep`)."""

    journal: Journal
    pusher: Pusher
    lines: LineRegistry
    telemetry: Telemetry
    alerts: Alerter
    # The most records one pass pushes, and one claim takes.
    max_per_run: int
    batch_limit: int
    # A `received` record unchanged this long is pushed.
    received_grace_s: float
    # A paused line's records are not pushed: they wait in the journal for its resume.
    paused: PausedLines | None = None
    # While an HTTP-sink line's circuit is open, its records wait in the journal but one.
    circuits: CircuitReader | None = None

    def sweep(self, *, now: datetime) -> SweepResult:
        """One pass over the journal, at most `max_per_run` records.

        Raises `JournalUnavailable`; never `BrokerUnavailable` (records whose push failed stay
        as they were, for the next pass)."""
        result = SweepResult()
        try:
            epoch = self.pusher.epoch()
            for line in self.lines:
                self._sweep_line(line, epoch=epoch, now=now, result=result)
        except BrokerUnavailable as exc:
            result.broker_down = True
            log.warning("sweep_broker_down", error=str(exc))
        self._report(result)
        return result

    def drain(self, line_name: str, *, now: datetime) -> SweepResult:
        """The sweep of one line, now: what the intake asks for when new records of the line
        wait behind older ones while its queue has room.

        Raises `JournalUnavailable` and `BrokerUnavailable`."""
        result = SweepResult()
        line = self.lines.get(line_name)
        self._sweep_line(line, epoch=self.pusher.epoch(), now=now, result=result)
        self._report(result)
        return result

    def _report(self, result: SweepResult) -> None:
        for line_name, count in result.enqueued.items():
            self.telemetry.count(Counter.SWEEP_ENQUEUED, count, line=line_name)
        for line_name, count in result.recovered.items():
            self.telemetry.count(Counter.SWEEP_RECOVERED, count, line=line_name)
            self.alerts.raise_event(
                Event.RECOVERED,
                line=line_name,
                message=f"{count} records of {line_name!r} were lost from Redis and enqueued again",
                count_recovered=count,
            )
        if result.enqueued:
            log.info(
                "sweep_finished",
                enqueued=result.enqueued,
                recovered=result.recovered,
            )

    def _sweep_line(self, line: Line, *, epoch: str, now: datetime, result: SweepResult) -> None:
        """One pass over `line`, oldest first, while its queue has room; no other pass over
        the line runs meanwhile (two would push its records out of order). The records of
        the senders behind (left out at their part of the bound) come after the others',
        each sender's oldest first and only as far as its part has room, so that a sender
        at its part holds up no other's. A pass that finds nothing of the line left to push
        lets its new records be pushed directly again."""
        if self.paused is not None and self.paused.is_paused(line.name):
            return  # what waits keeps its place: newer records stay behind it
        waiting = self.pusher.waiting
        with waiting.one_pass(line.queue) as ours:
            if not ours:
                return  # the pass under way does it
            mark = waiting.mark(line.queue)
            behind = sorted(mark.senders)
            rooms = waiting.rooms_behind(line.queue, behind, most=line.sender_max)
            steps = [Senders(skipping=behind)]
            steps += [Senders(only=sender, room=rooms[sender]) for sender in behind]
            budget, finished = self._budget(line), []
            for senders in steps:
                done, claimed = self._push_due(
                    line, epoch=epoch, now=now, result=result, budget=budget, senders=senders
                )
                budget -= claimed
                finished.append(done)
            # Each step that found nothing left frees its new records: the line's (the
            # senders not behind), or one sender's.
            cleared = [s.only for s, done in zip(steps[1:], finished[1:], strict=True) if done]
            if finished[0] or cleared:
                senders_done = [sender for sender in cleared if sender is not None]
                waiting.settle(line.queue, mark=mark, line=finished[0], senders=senders_done)

    def _budget(self, line: Line) -> int:
        """The most records of `line` this pass pushes: while its circuit is open, one (the
        next probe's candidate) when no probe is out, else none. The others wait where
        they are, in the journal, instead of each making a round through the queue and a
        worker every probe interval of the outage; the ramp paces them once it closes."""
        if self.circuits is None or not line.http_sink:
            return self.max_per_run
        try:
            circuit = self.circuits.state(line.name)
        except BrokerUnavailable:
            return self.max_per_run  # the push will say so
        if circuit.state is not State.OPEN:
            return self.max_per_run
        return 0 if circuit.probing else 1

    def _push_due(
        self,
        line: Line,
        *,
        epoch: str,
        now: datetime,
        result: SweepResult,
        budget: int,
        senders: Senders,
    ) -> tuple[bool, int]:
        """Claim and push the due records `senders` picks, oldest first, while the queue
        (and the sender's part) has room and `budget` (records this pass may still claim)
        lasts. Whether it found nothing more of them to push, and how many it claimed."""
        due = claims.Due(
            line=line.name,
            now=now,
            received_grace_s=self.received_grace_s,
            epoch=epoch,
            senders=senders,
        )
        pushed_all = claimed_all = 0
        while claimed_all < budget:
            room = line.settings.max_queue_length - self.pusher.depth(line.queue)
            if senders.room is not None:
                room = min(room, senders.room - pushed_all)
            limit = min(room, budget - claimed_all, self.batch_limit)
            if limit <= 0:
                # No room: finished only if nothing of them is waiting at all.
                with self.journal.reading("sweeping") as conn:
                    return not claims.any_due(conn, due), claimed_all
            with self.journal.transaction() as conn:
                claimed = claims.claim_due(conn, due, limit=limit)
            if not claimed:
                return True, claimed_all
            claimed_all += len(claimed)
            pushed = push_claimed(self.journal, self.pusher, line, claimed, now=now)
            pushed_all += len(pushed)
            _count(result, line.name, pushed, epoch=epoch)
            if len(pushed) < len(claimed):
                return False, claimed_all  # the queue, or the sender's part, filled up
        return False, claimed_all


def push_claimed(
    journal: Journal, pusher: Pusher, line: Line, claimed: list[Record], *, now: datetime
) -> list[Record]:
    """Push records claimed for it (`… → enqueued`, no epoch); put back what was not
    pushed. Returns the pushed records. Raises `BrokerUnavailable` (all put back)."""
    try:
        outcome = pusher.push(
            line.queue,
            [r.id for r in claimed],
            business_nos=[r.business_no for r in claimed],
            traceparents=[r.traceparent for r in claimed],
            senders=[r.sender for r in claimed],
            fair_share=line.settings.fair_share,
            sender_max=line.sender_max,
            max_length=line.settings.max_queue_length,
            batch_size=line.batch_size,
            keeps_left=True,
        )
    except BrokerUnavailable:
        with journal.transaction() as conn:
            claims.put_back(conn, claimed, now=now)
        raise
    pushed, left = outcome.split(claimed)
    try:
        with journal.transaction() as conn:
            claims.set_epoch(conn, [r.id for r in pushed], epoch=outcome.epoch)
            claims.put_back(conn, left, now=now)
    finally:
        pusher.waiting.left_kept(line.queue, outcome.leaving)
    return pushed


def _count(result: SweepResult, line: str, pushed: list[Record], *, epoch: str) -> None:
    if not pushed:
        return
    result.enqueued[line] = result.enqueued.get(line, 0) + len(pushed)
    recovered = sum(
        1
        for record in pushed
        if record.status is RecordStatus.ENQUEUED and record.queue_epoch not in (None, epoch)
    )
    if recovered:
        result.recovered[line] = result.recovered.get(line, 0) + recovered
