"""What lets a delivery go, and what its outcome tells its line's circuit: the circuit
(`app.delivery.circuit`) and the global limits (`app.delivery.limits`) as a delivery
thread meets them. Redis not answering, a delivery goes: the limits and the circuit cannot
be kept then, and the records can still be delivered."""

from __future__ import annotations

import time

from app.delivery.circuit import Admission, Change, Circuits, Counted, health_of
from app.delivery.flights import Flight
from app.delivery.limits import DeliveryLimits
from app.errors import BrokerUnavailable
from app.line_settings import limit_wait_s, longest_delivery_s
from app.lines import Line
from app.logs import get_logger
from app.observe.alerts import Alerter
from app.observe.events import Event

log = get_logger(__name__)


class DeliveryGates:
    """A line's circuit and global limits, as its deliveries meet them."""

    def __init__(
        self, *, limits: DeliveryLimits, circuits: Circuits, alerts: Alerter, lease_s: float
    ) -> None:
        self._limits = limits
        self._circuits = circuits
        self._alerts = alerts
        self._lease_s = lease_s

    @property
    def circuits(self) -> Circuits:
        return self._circuits

    def release(self, line: Line, slot: str | None) -> None:
        """Give back a slot `wait_for_limits` granted."""
        self._limits.release(line.name, slot)

    def longest_delivery_s(self, line: Line) -> float:
        """The longest one delivery may take: its limits' wait, then its request."""
        return longest_delivery_s(line.settings, lease_s=self._lease_s)

    def limit_wait_s(self) -> float:
        """The longest a delivery waits for room before its record is given back."""
        return limit_wait_s(self._lease_s)

    def ask_circuit(self, owner: str, line: Line) -> tuple[str, float]:
        """(`owner`, 0) when this delivery is the circuit's probe, ("", 0) when it may go,
        ("", s) when it must wait about `s` seconds. Redis not answering: it goes."""
        try:
            verdict = self._circuits.admit(
                line.name,
                line.settings,
                owner=owner,
                probe_lifetime_s=self.longest_delivery_s(line),
            )
        except BrokerUnavailable:
            return "", 0.0
        if verdict.admission is Admission.WAIT:
            return "", max(verdict.wait_s, 0.1)
        return (owner if verdict.admission is Admission.PROBE else ""), 0.0

    def wait_for_limits(self, line: Line) -> tuple[str | None, float | None]:
        """Wait for a slot and a token of `line`'s global limits: (the slot, None), or
        (None, seconds waited) when none came within the wait's budget. Redis not
        answering: the delivery goes (the limits cannot be kept, the records can)."""
        settings = line.settings
        if settings.delivery_rate is None and settings.delivery_concurrency is None:
            return None, None
        budget = self.limit_wait_s()
        began = time.monotonic()
        lifetime = settings.delivery_timeout_s + 1  # the request's one deadline, and a margin
        while True:
            try:
                grant = self._limits.ask(line.name, settings, lifetime_s=lifetime)
            except BrokerUnavailable as exc:
                log.warning("delivery_limits_unread", line=line.name, error=str(exc))
                return None, None
            if grant.granted:
                return grant.slot, None
            waited = time.monotonic() - began
            if waited + grant.wait_s > budget:
                return None, waited
            time.sleep(grant.wait_s)

    def count(self, flight: Flight, line: Line) -> Counted | None:
        """Count a delivery's outcome in its line's circuit; alert when it opened it."""
        if flight.not_started is not None or not flight.counts:
            return None
        health = health_of(delivered=flight.error is None, http_status=flight.http_status)
        try:
            counted = self._circuits.count(
                line.name, line.settings, health=health, owner=flight.probe
            )
        except BrokerUnavailable as exc:
            log.warning("circuit_uncounted", line=line.name, error=str(exc))
            return None
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
        return counted
