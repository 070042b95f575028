"""The attempt engine: every record of every sink goes through it, the same three steps.

1. **Claim** (`_claim_in`): the record's lease and attempt number, for records there is
   room for now: a free delivery slot in this process (and, for a handler, a free handler
   thread), the line's circuit and its global limits (`app.delivery.circuit`,
   `app.delivery.limits`, one Redis round trip each for a chunk of records, on the loop,
   each given `REDIS_STEP_S`). A paused line claims nothing more, also within a message
   already running, and nothing of a message starts past its start window (`_start_by`),
   so that the message ends within its lease.
2. **Deliver** (`_deliver`): to the sink (`app.delivery.sinks`): a POST on the process's
   async HTTP client, or the line's handler on a thread of the line's own
   (`sinks.HandlerThreads`), each within the line's one deadline. The table sink is
   written in the claim's own transaction.
3. **Record the outcome** (`_land`, `_write_outcomes`): the outcomes that ended together
   are counted in the circuit in one round trip and written in one transaction by the one
   outcome writer (`app.delivery.outcomes.record_outcome`).

HTTP deliveries and the engine's own steps run on one event loop thread per process, so
waiting on a downstream costs no thread; a worker's task threads hand their message to it
(`run`) and wait for its results, and the claims and outcomes of every message in flight
share transactions through the process's commit queue (`app.journal.commits`). The table
sink never waits: a message's records are claimed, written, marked done (or failed) in one
transaction, in the caller's thread.

A record the circuit, the limits, a pause, its message's start window or its line's held
handler threads keep from starting is not claimed: it waits in the journal (`failed` and
due again soon, or `deferred` while paused) without spending an attempt. So does a failure
while the circuit is open: an outage alone never makes a record `dead`. Whatever ends a
message's run, what it held goes back and the deliveries it started are recorded."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import random
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import aiohttp
import redis
import redis.asyncio as aioredis
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer
from sqlalchemy import Connection

from app.admission.pause import PausedLines, hold_back
from app.clock import utcnow
from app.config.line_settings import limit_wait_s, longest_delivery_s
from app.config.redis import make_async_redis
from app.delivery import sinks
from app.delivery.circuit import Admission, Change, Circuits, Outcome, State, Waiting, health_of
from app.delivery.limits import DeliveryLimits
from app.delivery.outcomes import (
    NOT_ATTEMPTED,
    POSTPONE_SPREAD,
    AttemptResult,
    Flight,
    asked_to_wait,
    attempt_row,
    attempt_span,
    circuit_open,
    describe_attempt,
    http_answer_of,
    http_status_of,
    log_skipped,
    ramping,
    record_outcome,
    report,
    retry_after_of,
)
from app.errors import AttemptsOverran, BrokerUnavailable, ConfigError, JournalUnavailable
from app.journal import attempt_log, attempts
from app.journal.attempt_log import Outcome as Ended
from app.journal.commits import in_one_transaction
from app.journal.journal import Journal
from app.journal.models import Record, RecordStatus
from app.lines import Line, LineRegistry
from app.telemetry.alerts import Alerter
from app.telemetry.counters import Telemetry
from app.telemetry.events import Event
from app.telemetry.logs import get_logger
from app.telemetry.tracing import parent_context

log = get_logger(__name__)

T = TypeVar("T")

# How long a journal write of the engine waits for its commit (the journal's own timeouts
# end a transaction well within it).
COMMIT_WAIT_S = 60.0
# How long a Redis step of the engine (the circuit's ask or count, the limits' ask or
# release) may take: each is one small Lua script or command that answers within a
# millisecond. One that has not answered by then finds Redis stalled, and the engine goes
# on without it, as when Redis is down: an outcome is never held behind a stalled Redis.
REDIS_STEP_S = 2.0
# How often, at most, a message waiting for room under its line's limits asks again.
LIMITS_POLL_S = 0.05
_RNG = random.Random()  # noqa: S311 - backoff jitter, not cryptography


@dataclass(frozen=True, kw_only=True)
class _Message:
    """The context of one message's attempts: its line, the lease owner of its attempts,
    its records' traceparents, the clock and the backoff's jitter."""

    line: Line
    owner: str
    parents: dict[str, str]
    clock: Callable[[], datetime]
    rng: random.Random
    # On the loop's clock: what has not started by then waits in the journal, so that the
    # message ends well within its visibility timeout (kombu would hand a copy of it out).
    start_by: float = 0.0
    # Records of the message found to be of another line, by line (their claims say so).
    elsewhere: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class _Room:
    """What a chunk of a message may start now: `ids` (the first the circuit's `probe`
    when one is named), holding the limits' `slots`; the others wait `wait_s` (`why`)."""

    ids: list[str]
    probe: str = ""
    slots: tuple[str, ...] = ()
    wait_s: float = 0.0
    why: str = ""


@dataclass(kw_only=True)
class _Landed:
    """A delivery that ended: its flight, the limits' slot it held, its span (open until
    its outcome is recorded) and the event that says it is."""

    flight: Flight
    slot: str | None
    span: Span
    recorded: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class _Started:
    """The last word of a message's claims: how many deliveries it started."""

    count: int


class _Slots:
    """A line's delivery slots in this process (on the loop): a record is claimed only
    when its delivery can start at once, so that no claimed record waits while its lease
    runs out. Messages that wait for slots are served in the order they came."""

    def __init__(self, free: int) -> None:
        self.free = free
        self._waiters: deque[tuple[int, asyncio.Future[int]]] = deque()
        self._handing = False  # a hand-out is due on the loop

    async def take(self, most: int, *, timeout_s: float) -> int:
        """Between 1 and `most` slots, waiting up to `timeout_s` for the first, behind the
        messages that came first; 0: none came free in time. Cancelled, it holds none."""
        if self.free > 0 and not self._waiters:
            taken = min(most, self.free)
            self.free -= taken
            return taken
        if timeout_s <= 0:
            return 0
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        waiter = (most, future)
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            self._undo(future)
            return 0
        except asyncio.CancelledError:
            self._undo(future)
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def give(self, count: int = 1) -> None:
        """Give back `count` slots, to the first messages waiting: handed out once the
        deliveries ending at this turn of the loop have all given theirs back, so that a
        waiting message gets what came free together, not one slot each."""
        if count <= 0:
            return
        self.free += count
        if self._waiters and not self._handing:
            self._handing = True
            asyncio.get_running_loop().call_soon(self._hand_out)

    def _hand_out(self) -> None:
        self._handing = False
        while self.free > 0 and self._waiters:
            most, future = self._waiters.popleft()
            if future.done():
                continue
            taken = min(most, self.free)
            self.free -= taken
            future.set_result(taken)

    def _undo(self, future: asyncio.Future[int]) -> None:
        """A waiter that gave up: the slots it was handed meanwhile go back."""
        if future.done() and not future.cancelled():
            self.give(future.result())
        else:
            future.cancel()


@dataclass(kw_only=True)
class _Run:
    """One message's run on the loop: what it waits for now (the outer bound names it),
    how many deliveries it started, and what it holds that no delivery holds yet: slots
    of this process and the `room` it was given (the limits' slots, the probe)."""

    waiting_for: str = "its first claim"
    started: int = 0
    slots: int = 0
    room: _Room | None = None
    step: asyncio.Future[None] | None = None


class AttemptEngine:
    """Runs attempts of records, for the worker's task and for the intake's `caller_runs`
    (see the module)."""

    def __init__(  # noqa: PLR0913 - the pieces it is built on, keyword-only
        self,
        *,
        journal: Journal,
        lines: LineRegistry,
        telemetry: Telemetry,
        alerts: Alerter,
        redis_url: str,
        redis_options: dict[str, Any],
        paused: PausedLines,
        tracer: Tracer,
        lease_s: float,
    ) -> None:
        self._journal = journal
        self._commits = in_one_transaction(journal, timeout_s=COMMIT_WAIT_S)
        self._lines = lines
        self._telemetry = telemetry
        self._alerts = alerts
        self._redis_url = redis_url
        self._redis_options = redis_options
        self._paused = paused
        self._tracer = tracer
        self._lease_s = lease_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()
        # Made on the loop, on first use: the HTTP sink's client, the Redis client of the
        # circuits and limits, each line's slots and handler threads.
        self._session: aiohttp.ClientSession | None = None
        self._redis: aioredis.Redis | None = None
        self._circuits: Circuits | None = None
        self._limits: DeliveryLimits | None = None
        self._slots: dict[str, _Slots] = {}
        self._handlers: dict[str, sinks.HandlerThreads] = {}
        # Deliveries, and steps that outlive what started them (giving back a room), kept
        # from the GC.
        self._tail: set[asyncio.Future[None]] = set()

    # The loop, and the way in from other threads.

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The engine's loop, on a thread of its own, started on first use."""
        with self._starting:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=_serve, args=(self._loop,), name="deliveries", daemon=True
                )
                self._thread.start()
            return self._loop

    def _call(self, work: Coroutine[Any, Any, T], run: _Run, *, timeout_s: float) -> T:
        """Run `work` on the loop and wait for it, `timeout_s` at most. Past that it is not
        cancelled (a cancel would strand what it holds): it goes on and settles its records
        itself, and the caller gets `AttemptsOverran`, saying what it waited for."""
        future = asyncio.run_coroutine_threadsafe(work, self._running_loop())
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            raise AttemptsOverran(
                f"the attempts did not end within {timeout_s:g} s: waiting for "
                f"{run.waiting_for}, {run.started} deliveries started"
            ) from None

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Close the HTTP sink's client, stop the loop (within `timeout_s`) and the commit
        queue."""
        with self._starting:
            loop, thread, self._loop = self._loop, self._thread, None
        if loop is not None and thread is not None:
            with contextlib.suppress(Exception):
                closing = asyncio.run_coroutine_threadsafe(self._close_clients(), loop)
                closing.result(timeout=timeout_s)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=timeout_s)
            # They belong to the loop that stopped.
            self._slots, self._handlers, self._tail = {}, {}, set()
            self._session, self._redis, self._circuits, self._limits = None, None, None, None
        self._commits.close()

    async def _close_clients(self) -> None:
        session, client = self._session, self._redis
        self._session, self._redis, self._circuits, self._limits = None, None, None, None
        if session is not None:
            await session.close()
        if client is not None:
            await client.aclose()

    def run(
        self,
        record_ids: list[str],
        *,
        line: Line,
        parents: dict[str, str] | None = None,
        clock: Callable[[], datetime] = utcnow,
        rng: random.Random = _RNG,
    ) -> list[AttemptResult]:
        """One attempt of each of `record_ids` (records of `line`, a message's). Returns
        each one's result, in the order given (an id met twice runs once). A record that
        did not run (unknown, final, in flight elsewhere, held back by a pause, waiting for
        its circuit or for room) has a result that says nothing. Raises `JournalUnavailable`
        when a claim cannot be made or an outcome not recorded (the leases then lapse and
        the sweeper pushes the records again); `AttemptsOverran` when they outlast their
        bound (they go on, and settle their records themselves)."""
        ids = list(dict.fromkeys(record_ids))
        message = _Message(
            line=line, owner=attempts.new_owner(), parents=parents or {}, clock=clock, rng=rng
        )
        found = self._attempt_all(ids, message)
        return [found.get(record_id) or AttemptResult(record_id=record_id) for record_id in ids]

    def _attempt_all(self, ids: list[str], message: _Message) -> dict[str, AttemptResult]:
        """The attempts of `ids` on the message's line; then, with their own line's sink and
        rules, those of its records that are of another line (a message sent to the wrong
        queue). The table sink never waits: its attempts run in the caller's thread, in
        one transaction; the others' deliveries on the loop."""
        line = message.line
        if self._paused.is_paused(line.name):
            now = message.clock()
            with self._journal.transaction("holding back records of a paused line") as conn:
                held = hold_back(conn, ids, now=now)
            log.info("records_held_line_paused", line=line.name, record_ids=ids[:10], held=held)
            return {}
        if line.table_sink:
            results = self._table_sink(ids, message)
        else:
            message = dataclasses.replace(message, start_by=self._start_by())
            # Every step of a message is bounded (its starts by `limit_wait_s`, a delivery
            # by its deadline, a commit by `COMMIT_WAIT_S`): this only names a defect.
            bound_s = self._lease_s + 2 * COMMIT_WAIT_S
            run = _Run()
            results = self._call(self._deliver_all(ids, message, run), run, timeout_s=bound_s)
        for name, elsewhere in message.elsewhere.items():
            if name in self._lines.names():
                own = dataclasses.replace(message, line=self._lines.get(name), elsewhere={})
                results |= self._attempt_all(elsewhere, own)
        return results

    # Step 1: claim.

    def _claim_in(self, conn: Connection, ids: list[str], message: _Message) -> list[Record]:
        """Claim an attempt of each of `ids` (one statement), in their order (of two
        records with one business number, the later one wins); say why of the others."""
        now, line = message.clock(), message.line.name
        claimed = attempts.claim_attempts(
            conn, ids, owner=message.owner, lease_s=self._lease_s, now=now, line=line
        )
        by_id = {record.id: record for record in claimed}
        for record_id in ids:
            if record_id not in by_id:
                own = log_skipped(conn, record_id, now)
                if own is not None and own != line:
                    message.elsewhere.setdefault(own, []).append(record_id)
        return [by_id[record_id] for record_id in ids if record_id in by_id]

    async def _room(self, candidates: list[str], message: _Message, run: _Run) -> _Room:
        """What of `candidates` may start now: the circuit's verdict for all of them, then
        the limits' tokens and slots, one round trip each (waiting for room until the
        message's `start_by`). Redis not answering in time, they go: the circuit and the
        limits cannot be kept then, and the records can still be delivered."""
        line = message.line
        if not line.http_sink:
            return _Room(ids=candidates)
        run.waiting_for = "the circuit"
        room = await self._circuit_room(candidates, message)
        unlimited = (
            line.settings.delivery_rate is None and line.settings.delivery_concurrency is None
        )
        if not room.ids or unlimited:
            return room
        run.waiting_for = "room under the delivery limits"
        run.room = room  # its probe is held from here
        return await self._limits_room(room, message)

    async def _circuit_room(self, candidates: list[str], message: _Message) -> _Room:
        line = message.line
        probe = f"{message.owner}:{candidates[0]}"
        circuits, _, _ = self._redis_parts()
        try:
            verdict = await _within(
                circuits.admit(
                    line.name,
                    line.settings,
                    owner=probe,
                    probe_lifetime_s=longest_delivery_s(line.settings, lease_s=self._lease_s),
                    want=len(candidates),
                )
            )
        except BrokerUnavailable as exc:
            log.warning("circuit_unread", line=line.name, error=str(exc))
            return _Room(ids=candidates)
        if verdict.admission is Admission.WAIT:
            why = {
                Waiting.HOLD: asked_to_wait(line.name),
                Waiting.RAMP: ramping(line.name),
            }.get(verdict.waiting, circuit_open(line.name))
            return _Room(ids=[], wait_s=max(verdict.wait_s, 0.1), why=why)
        return _Room(
            ids=candidates[: max(1, verdict.granted)],
            probe=probe if verdict.admission is Admission.PROBE else "",
        )

    async def _limits_room(self, room: _Room, message: _Message) -> _Room:
        line = message.line
        _, limits, _ = self._redis_parts()
        loop = asyncio.get_running_loop()
        began = loop.time()
        while True:
            try:
                grant = await _within(
                    limits.ask(
                        line.name,
                        line.settings,
                        want=len(room.ids),
                        # From now: the claim, then the request and its one deadline.
                        lifetime_s=longest_delivery_s(line.settings, lease_s=self._lease_s),
                    )
                )
            except BrokerUnavailable as exc:
                log.warning("delivery_limits_unread", line=line.name, error=str(exc))
                return room
            if grant.count:
                return _Room(ids=room.ids[: grant.count], probe=room.probe, slots=grant.slots)
            if loop.time() + grant.wait_s > message.start_by:
                why = (
                    f"no room under {line.name}'s delivery limits within "
                    f"{loop.time() - began:.0f} s"
                )
                return _Room(
                    ids=[],
                    probe=room.probe,
                    wait_s=message.rng.uniform(1, 1 + POSTPONE_SPREAD),
                    why=why,
                )
            # At least `LIMITS_POLL_S`: a full concurrency limit answers "5 ms", and each
            # waiting message asking that often would keep the loop and Redis busy.
            await asyncio.sleep(max(grant.wait_s, LIMITS_POLL_S))

    # Step 2: deliver.

    async def _deliver_all(
        self, ids: list[str], message: _Message, run: _Run
    ) -> dict[str, AttemptResult]:
        """Claim `ids` as the line's slots come free, a chunk at a time, and deliver each
        record at once; then record every outcome. However the claims end (their start
        window passed, an error, a cancel), what they held goes back and the deliveries
        started land and are recorded."""
        landed: asyncio.Queue[_Landed | _Started] = asyncio.Queue()
        collector = asyncio.create_task(self._collect(landed, message))
        try:
            await self._start_all(ids, message, run, landed)
        except BaseException:
            if run.step is not None:  # a claim on its way: its deliveries start
                with contextlib.suppress(Exception):
                    await asyncio.shield(run.step)
            self._give_back(run, message.line)
            landed.put_nowait(_Started(run.started))
            with contextlib.suppress(Exception):
                await asyncio.shield(collector)
            raise
        landed.put_nowait(_Started(run.started))
        run.waiting_for = f"the outcomes of {run.started} deliveries"
        return await asyncio.shield(collector)

    async def _start_all(
        self,
        ids: list[str],
        message: _Message,
        run: _Run,
        landed: asyncio.Queue[_Landed | _Started],
    ) -> None:
        """Start deliveries of `ids`, a chunk at a time, each asking the pause, the
        circuit and the limits first. What has not started by the message's `start_by`
        waits in the journal, no attempt spent."""
        line = message.line
        loop = asyncio.get_running_loop()
        slots = self._slots_of(line)
        waiting = list(ids)
        asked = True  # the first chunk's pause was asked before the message came here
        while waiting:
            if not asked and await self._is_paused(line, run):
                # Paused while the message ran: what it has not claimed waits (`deferred`).
                await self._hold_back_rest(waiting, message)
                return
            run.waiting_for = "a delivery slot of this process"
            left_s = message.start_by - loop.time()
            if left_s <= 0:
                await self._postpone(waiting, message, _WINDOW_PASSED)
                return
            run.slots = await slots.take(len(waiting), timeout_s=left_s)
            if run.slots == 0:
                await self._postpone(waiting, message, _no_slot(left_s))
                return
            if line.handler is not None:
                # Once the slot is held: the call before may have overrun meanwhile.
                waiting = await self._handler_room(waiting, message)
                if not waiting:
                    self._give_back(run, line)
                    return
            room = await self._room(waiting[: run.slots], message, run)
            slots.give(run.slots - len(room.ids))
            run.slots, run.room = len(room.ids), room
            if room.ids and loop.time() > message.start_by:  # the room came too late
                room = dataclasses.replace(room, ids=[], why=_WINDOW_PASSED, wait_s=1.0)
            if not room.ids:
                self._give_back(run, line)
                await self._postpone(waiting, message, room.why, after_s=room.wait_s)
                return
            waiting, asked = waiting[len(room.ids) :], False
            run.waiting_for = "the claim's commit"
            # Shielded: a claim the journal makes is delivered, whatever befalls the message.
            run.step = asyncio.ensure_future(self._claim_and_fly(room, message, run, landed))
            await asyncio.shield(run.step)
            run.step = None

    async def _claim_and_fly(
        self,
        room: _Room,
        message: _Message,
        run: _Run,
        landed: asyncio.Queue[_Landed | _Started],
    ) -> None:
        """Claim `room`'s records and start their deliveries, each taking one of the slots
        and what `room` holds for it; what the unclaimed ones held goes back."""
        line, slots = message.line, self._slots_of(message.line)
        claimed: list[Record] = await self._commits.put(
            functools.partial(self._claim_in, ids=room.ids, message=message)
        )
        by_id = {record.id: record for record in claimed}
        held = dict(zip(room.ids, room.slots, strict=False))
        dropped = "" if room.ids[0] in by_id else room.probe
        unused = tuple(s for i, s in zip(room.ids, room.slots, strict=False) if i not in by_id)
        run.slots, run.room = 0, None
        slots.give(len(room.ids) - len(claimed))
        self._give_back_room(line, _Room(ids=[], probe=dropped, slots=unused))
        for record in claimed:
            probe = room.probe if record.id == room.ids[0] else ""
            fly = self._fly(record, message, probe, held.get(record.id), slots, landed)
            self._keep(asyncio.ensure_future(fly))  # it reports on `landed`, awaited there
        run.started += len(claimed)

    async def _handler_room(self, ids: list[str], message: _Message) -> list[str]:
        """Of `ids` (a handler line's), those that may be called now: none while every
        handler thread is held by a call that overran (`HANDLER_STUCK`), and none whose
        last call has not returned. The others wait, no attempt spent."""
        line = message.line
        threads = self._handlers_of(line)
        if threads.free > 0 and threads.said_stuck:
            threads.said_stuck = False
            self._say_stuck(threads.stuck_key, stuck=False)
        if threads.free <= 0:
            threads.said_stuck = True
            self._say_stuck(threads.stuck_key, stuck=True)
            self._alerts.raise_event(
                Event.HANDLER_STUCK,
                line=line.name,
                message=f"every handler thread of {line.name} in a worker process "
                f"({line.settings.handler_threads}) is held by a call that overran "
                f"{line.settings.delivery_timeout_s:g} s: nothing of {line.name} starts "
                "there until one returns; records wait, no attempt spent",
                threads=line.settings.handler_threads,
            )
            await self._postpone(ids, message, _STUCK.format(line=line.name), after_s=_HELD_S)
            return []
        busy = [record_id for record_id in ids if threads.running(record_id)]
        if busy:
            await self._postpone(busy, message, _STILL_RUNNING, after_s=_HELD_S)
        return [record_id for record_id in ids if record_id not in busy]

    def _say_stuck(self, key: str, *, stuck: bool) -> None:
        """Say in Redis, for the line's health, whether this process's handler threads of
        a line are all held (in a step of its own: nothing waits on it)."""

        async def say() -> None:
            redis_client = self._redis_parts()[2]
            if stuck:
                await redis_client.set(key, "1", ex=sinks.HANDLERS_STUCK_TTL_S)
            else:
                await redis_client.delete(key)

        self._in_tail(say())

    def _give_back(self, run: _Run, line: Line) -> None:
        """Give back what `run` holds that no delivery holds: its slots of this process at
        once, its room's limits' slots and probe in a round trip of their own."""
        self._slots_of(line).give(run.slots)
        if run.room is not None:
            self._give_back_room(line, run.room)
        run.slots, run.room = 0, None

    def _give_back_room(self, line: Line, room: _Room) -> None:
        """Give back `room`'s probe and the limits' slots, in a step of their own (one that
        outlives a cancel of whoever gave them back)."""
        if room.probe or room.slots:
            self._in_tail(self._release_room(line, room))

    def _in_tail(self, step: Coroutine[Any, Any, None]) -> None:
        """Run `step` on the loop on its own, bounded by `REDIS_STEP_S`; its failure is
        logged."""

        async def bounded() -> None:
            try:
                await _within(step)
            except (BrokerUnavailable, redis.RedisError) as exc:
                log.warning("redis_step_skipped", error=str(exc))

        self._keep(asyncio.ensure_future(bounded()))

    def _keep(self, task: asyncio.Future[None]) -> None:
        """Keep `task` referenced until it ends (the loop keeps only weak references)."""
        self._tail.add(task)
        task.add_done_callback(self._tail.discard)

    async def _release_room(self, line: Line, room: _Room) -> None:
        """Give back `room`'s probe and limits' slots (else they lapse at their lifetime)."""
        circuits, limits, _ = self._redis_parts()
        if room.slots:
            await limits.release(line.name, room.slots)
        if room.probe:
            await circuits.drop_probe(line.name, room.probe)

    async def _fly(
        self,
        record: Record,
        message: _Message,
        probe: str,
        slot: str | None,
        slots: _Slots,
        landed: asyncio.Queue[_Landed | _Started],
    ) -> None:
        """One delivery, within its attempt's span (current meanwhile: the request's own
        span is its child, and the span ends once the outcome is recorded)."""
        name, attributes = attempt_span(record.id, message.line)
        parent = parent_context(self._tracer, message.parents.get(record.id))
        with self._tracer.start_as_current_span(
            name, context=parent, kind=SpanKind.CONSUMER, attributes=attributes
        ) as span:
            try:
                flight = await self._deliver(record, message, probe)
            finally:
                slots.give()
            ended = _Landed(flight=flight, slot=slot, span=span)
            await landed.put(ended)
            if span.is_recording():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ended.recorded.wait(), COMMIT_WAIT_S)

    async def _deliver(self, record: Record, message: _Message, probe: str) -> Flight:
        """The record to its sink, within the line's one deadline; never raises."""
        line, clock = message.line, message.clock
        started = clock()
        if record.attempts > line.settings.max_attempts:
            # Attempts that never reported back: each one killed its worker process.
            lost = RuntimeError("the worker was lost on every attempt")
            return Flight(
                record=record, started_at=started, finished_at=clock(), error=lost, counts=False
            )
        try:
            status = await self._to_sink(record, line)
        except Exception as exc:  # noqa: BLE001 - any failure is the attempt's
            return Flight(
                record=record,
                started_at=started,
                finished_at=clock(),
                http_status=http_status_of(exc),
                http_answer=http_answer_of(exc),
                error=exc,
                probe=probe,
            )
        return Flight(
            record=record, started_at=started, finished_at=clock(), http_status=status, probe=probe
        )

    async def _to_sink(self, record: Record, line: Line) -> int | None:
        """Hand `record` to its line's sink: the HTTP status of a delivered answer (None
        from a handler). Raises what failed the attempt."""
        settings = line.settings
        if line.http_sink and settings.downstream_url:
            return await sinks.deliver_http(
                self._http(),
                record,
                url=settings.downstream_url,
                delivered=settings.delivered,
                timeout_s=settings.delivery_timeout_s,
                signing_secret=settings.signing_secret,
                tracer=self._tracer,
            )
        if line.handler is not None:
            threads = self._handlers_of(line)
            await threads.call(line.handler, record, timeout_s=settings.delivery_timeout_s)
            return None
        # Settings validation makes this unreachable.
        raise ConfigError(f"line {line.name!r}: sink {line.sink} is not configured")

    # Step 3: record the outcomes.

    async def _collect(
        self, landed: asyncio.Queue[_Landed | _Started], message: _Message
    ) -> dict[str, AttemptResult]:
        """Record the outcomes of a message's deliveries as they land, those that landed
        together at once. Raises the first failure to record, once every delivery has
        landed."""
        results: dict[str, AttemptResult] = {}
        pending_error: Exception | None = None
        expected: int | None = None
        seen = 0
        while expected is None or seen < expected:
            together = [await landed.get()]
            while not landed.empty():
                together.append(landed.get_nowait())
            ended = [item for item in together if isinstance(item, _Landed)]
            expected = next((i.count for i in together if isinstance(i, _Started)), expected)
            seen += len(ended)
            if not ended:
                continue
            try:
                results |= await self._land(ended, message)
            except Exception as exc:  # noqa: BLE001 - the others' outcomes come first
                pending_error = pending_error or exc
            finally:
                for one in ended:
                    describe_attempt(one.span, results.get(one.flight.record.id))
                    one.recorded.set()
        if pending_error is not None:
            raise pending_error
        return results

    async def _land(self, ended: list[_Landed], message: _Message) -> dict[str, AttemptResult]:
        """Count the outcomes in the circuit, give back the limits' slots (a round trip
        each), then record them in one transaction."""
        line = message.line
        flights = [one.flight for one in ended]
        if line.http_sink:
            await self._count(flights, line)
        held = tuple(one.slot for one in ended if one.slot is not None)
        self._give_back_room(line, _Room(ids=[], slots=held))
        results = await self._commits.put(lambda conn: self._write_outcomes(conn, flights, message))
        self._report(results, line)
        return {result.record_id: result for result in results}

    async def _count(self, flights: list[Flight], line: Line) -> None:
        """Count what the flights say of the downstream in its line's circuit (alert when
        they opened it); each learns whether the circuit is open after them."""
        outcomes = [
            Outcome(
                health=health_of(delivered=flight.error is None, http_status=flight.http_status),
                owner=flight.probe,
                retry_after_s=(retry_after_of(flight.error) or 0.0) if flight.error else 0.0,
            )
            for flight in flights
            if flight.counts
        ]
        if not outcomes:
            return
        circuits, _, _ = self._redis_parts()
        try:
            counted = await _within(circuits.count_all(line.name, line.settings, outcomes))
        except BrokerUnavailable as exc:
            log.warning("circuit_uncounted", line=line.name, error=str(exc))
            return
        if counted.change is Change.OPENED:
            self._alerts.raise_event(
                Event.DOWNSTREAM_DOWN,
                line=line.name,
                message=f"{line.name}'s downstream failed {counted.failed} of the last "
                f"{counted.counted} deliveries: the circuit is open, one probe every "
                f"{line.settings.circuit_probe_interval_s:g} s, records wait without "
                "spending attempts",
                failed=counted.failed,
                counted=counted.counted,
                window_s=line.settings.circuit_window_s,
            )
            log.error("circuit_opened", line=line.name, failed=counted.failed)
        elif counted.change is Change.CLOSED:
            log.info("circuit_closed", line=line.name)
        for flight in flights:
            flight.circuit_open = flight.counts and counted.state is State.OPEN

    def _write_outcomes(
        self, conn: Connection, flights: list[Flight], message: _Message
    ) -> list[AttemptResult]:
        """Record `flights`' outcomes and their attempts' rows, on the commit queue's
        connection."""
        now = message.clock()
        results: list[AttemptResult] = []
        rows: list[attempt_log.Attempt] = []
        for flight in flights:
            result, row = record_outcome(
                conn, flight, message.owner, message.line, now=now, rng=message.rng
            )
            results.append(result)
            rows.append(row)
        attempt_log.write(conn, rows)
        return results

    def _report(self, results: list[AttemptResult], line: Line) -> None:
        for result in results:
            report(result, line, telemetry=self._telemetry, alerts=self._alerts)

    # The table sink: claimed, written and recorded in one transaction.

    def _table_sink(self, ids: list[str], message: _Message) -> dict[str, AttemptResult]:
        """The table sink's attempts of `ids`, in one transaction: claimed and done in one
        statement, their rows written in one more, in the message's order (of two records
        with one business number, the later one wins). When the table refuses a row (a
        payload it cannot hold), none of that is kept, and one more transaction claims the
        records and writes each row in a savepoint of its own, so that one fails alone."""
        line = message.line
        spans = {record_id: self._start_span(record_id, message) for record_id in ids}
        try:
            try:
                with self._journal.transaction(f"table sink of {len(ids)} records") as conn:
                    results = self._claim_write_done(conn, ids, message)
            except _TableRefused:
                with self._journal.transaction(f"table sink of {len(ids)} records") as conn:
                    results = self._claim_write_each(conn, ids, message)
        except BaseException as exc:
            for span in spans.values():
                span.set_status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
                span.end()
            raise
        found = {result.record_id: result for result in results}
        self._report(results, line)
        for record_id, span in spans.items():
            describe_attempt(span, found.get(record_id, AttemptResult(record_id=record_id)))
            span.end()
        return found

    def _claim_write_done(
        self, conn: Connection, ids: list[str], message: _Message
    ) -> list[AttemptResult]:
        line, now = message.line, message.clock()
        done = attempts.claim_done_all(
            conn, ids, line=line.name, max_attempts=line.settings.max_attempts, now=now
        )
        by_id = {record.id: record for record in done}
        in_order = [by_id[record_id] for record_id in ids if record_id in by_id]
        try:
            sinks.write_table_sink_all(conn, in_order, table=line.sink_table, now=now)
        except Exception as exc:
            raise _TableRefused from exc
        attempt_log.write(conn, [_done_row(record, message.owner, now) for record in in_order])
        results = [_done(record) for record in in_order]
        rest = [record_id for record_id in ids if record_id not in by_id]
        # Out of attempts, in flight, final, or of another line: the claim says which.
        return results + self._claim_write_each(conn, rest, message)

    def _claim_write_each(
        self, conn: Connection, ids: list[str], message: _Message
    ) -> list[AttemptResult]:
        if not ids:
            return []
        line, owner = message.line, message.owner
        claimed = self._claim_in(conn, ids, message)
        now = message.clock()
        in_reach = [r for r in claimed if r.attempts <= line.settings.max_attempts]
        refused = sinks.write_rows(conn, in_reach, table=line.sink_table, now=now)
        delivered = [r for r in in_reach if r.id not in refused]
        delivered_ids = {r.id for r in delivered}
        _mark_done_all(conn, delivered, owner=owner, now=now)
        attempt_log.write(conn, [_done_row(record, owner, now) for record in delivered])
        lost = RuntimeError("the worker was lost on every attempt")
        failed = [
            Flight(
                record=r,
                started_at=now,
                finished_at=now,
                error=refused.get(r.id) or lost,
                counts=False,
            )
            for r in claimed
            if r.id not in delivered_ids
        ]
        return [_done(r) for r in delivered] + self._write_outcomes(conn, failed, message)

    # What keeps records from starting.

    async def _is_paused(self, line: Line, run: _Run) -> bool:
        """Whether `line` is paused, as read at most a second ago: read on the commit
        queue's connection when due (the journal not answering, as last read)."""
        known = self._paused.known()
        if known is None:
            run.waiting_for = "the pause's read"
            try:
                known = await self._commits.put(self._paused.read_in)
            except JournalUnavailable as exc:
                log.warning("paused_lines_unread", error=str(exc))
                known = self._paused.last()
        return line.name in known

    async def _hold_back_rest(self, ids: list[str], message: _Message) -> None:
        now = message.clock()
        held = await self._commits.put(lambda conn: hold_back(conn, ids, now=now))
        log.info("records_held_line_paused", line=message.line.name, record_ids=ids[:10], held=held)

    async def _postpone(
        self, ids: list[str], message: _Message, why: str, *, after_s: float = 1.0
    ) -> None:
        """No attempt of `ids` starts now (`why`): they wait as `failed`, due again in
        about `after_s`, without spending an attempt."""
        now = message.clock()
        spread = message.rng.uniform(0, POSTPONE_SPREAD)
        retry_at = now + timedelta(seconds=after_s + spread)
        reason = f"{NOT_ATTEMPTED}{why}"
        moved = await self._commits.put(
            lambda conn: attempts.postpone(conn, ids, reason=reason, retry_at=retry_at, now=now)
        )
        log.info("deliveries_postponed", line=message.line.name, postponed=moved, why=why)

    # Made on first use, on the loop.

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = sinks.http_session()
        return self._session

    def _slots_of(self, line: Line) -> _Slots:
        if line.name not in self._slots:
            size = line.settings.deliveries_in_flight if line.http_sink else 1
            self._slots[line.name] = _Slots(size)
        return self._slots[line.name]

    def _handlers_of(self, line: Line) -> sinks.HandlerThreads:
        if line.name not in self._handlers:
            size = line.settings.handler_threads
            self._handlers[line.name] = sinks.HandlerThreads(line.name, size=size)
        return self._handlers[line.name]

    def _redis_parts(self) -> tuple[Circuits, DeliveryLimits, aioredis.Redis]:
        """The circuits, the limits and their client, of this loop."""
        if self._circuits is None or self._limits is None or self._redis is None:
            self._redis = make_async_redis(self._redis_url, self._redis_options)
            self._circuits, self._limits = Circuits(self._redis), DeliveryLimits(self._redis)
        return self._circuits, self._limits, self._redis

    def _start_by(self) -> float:
        """When, on the loop's clock, what a message starting now has not started must
        wait instead: within a quarter of its lease (`limit_wait_s`), so that its last
        delivery, with its deadline, ends within its lease, and the message is acked
        before kombu's visibility timeout would hand a copy of it out."""
        return self._running_loop().time() + limit_wait_s(self._lease_s)

    def _start_span(self, record_id: str, message: _Message) -> Span:
        name, attributes = attempt_span(record_id, message.line)
        return self._tracer.start_span(
            name,
            context=parent_context(self._tracer, message.parents.get(record_id)),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
        )


# Why records of a handler line did not start.
_STUCK = "every handler thread of {line} in this worker process is held by a call that overran"
_STILL_RUNNING = "the handler's last call of the record has not returned"
# How long a record held back by a handler call that overran waits before it is tried
# again: a hung call does not return in a second, and each try is a journal write.
_HELD_S = 5.0
# Why the rest of a message did not start: past its start window (`_start_by`), a start
# could outlive its lease and its message kombu's visibility timeout.
_WINDOW_PASSED = "its message's start window passed (a quarter of the lease)"


def _no_slot(waited_s: float) -> str:
    return f"no delivery slot of this worker process came free within {max(waited_s, 0):.0f} s"


async def _within(step: Awaitable[T]) -> T:
    """A Redis step of the engine, within `REDIS_STEP_S`. Raises `BrokerUnavailable` when
    Redis did not answer in time (or at all)."""
    try:
        async with asyncio.timeout(REDIS_STEP_S):
            return await step
    except TimeoutError as exc:
        raise BrokerUnavailable(f"Redis did not answer within {REDIS_STEP_S:g} s") from exc


def _mark_done_all(conn: Connection, claimed: list[Record], *, owner: str, now: datetime) -> None:
    """Mark done records claimed in this same transaction (none can be lost meanwhile)."""
    if attempts.mark_done_all(conn, claimed, owner=owner, now=now) != len(claimed):
        raise JournalUnavailable("records claimed in this transaction could not be marked done")


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The engine's loop thread: run `loop` until it is stopped, then close it."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.sleep(0))
        loop.close()


class _TableRefused(Exception):
    """The table refused a row of the batch: nothing of its transaction is kept."""


def _done(record: Record) -> AttemptResult:
    return AttemptResult(
        record_id=record.id, record=record, status=RecordStatus.DONE, outcome=Ended.DONE
    )


def _done_row(record: Record, owner: str, at: datetime) -> attempt_log.Attempt:
    return attempt_row(record, owner=owner, started_at=at, finished_at=at, outcome=Ended.DONE)
