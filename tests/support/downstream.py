"""Downstream doubles for the delivery path: real HTTP servers on 127.0.0.1 that count
what is in flight, when each request arrived, and answer as the test says."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.support.recorder import Received, _SmallServer


class Gauged(_SmallServer):
    """Answers `status` (changeable at any time), after `delay_s`; keeps how many requests
    it had in flight at once (`most_in_flight`), and holds a request whose
    `Idempotency-Key` is in `held` (or any first attempt while `hold_first` is set) until
    `release()`, or `hold_s` at most."""

    def __init__(self, *, delay_s: float = 0.0, hold_s: float = 30.0) -> None:
        super().__init__()
        self.status = 200
        self.delay_s = delay_s
        self.hold_s = hold_s
        self.held: set[str] = set()
        self.hold_first = False
        self.in_flight = 0
        self.most_in_flight = 0
        self.released = threading.Event()
        # Wall-clock arrival of each request, with its X-Attempt header.
        self.arrivals: list[tuple[float, str]] = []

    def release(self) -> None:
        self.released.set()

    def answer(self, method: str, received: Received) -> int:
        key = received.headers.get("Idempotency-Key", "")
        with self.lock:
            self.arrivals.append((time.time(), received.headers.get("X-Attempt", "")))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            hold = key in self.held or (
                self.hold_first and received.headers.get("X-Attempt") == "1"
            )
        try:
            if hold:
                self.released.wait(timeout=self.hold_s)
            elif self.delay_s:
                time.sleep(self.delay_s)
            return self.status
        finally:
            with self.lock:
                self.in_flight -= 1

    def first_attempts_within(self, seconds: float) -> int:
        """How many first attempts arrived within `seconds` of the first one."""
        with self.lock:
            firsts = sorted(t for t, attempt in self.arrivals if attempt == "1")
        return sum(1 for t in firsts if t - firsts[0] < seconds) if firsts else 0

    def busiest_second(self, *, since: float = 0.0, until: float = float("inf")) -> int:
        """The most requests that arrived within any one second (a sliding window) between
        `since` and `until` (wall clock)."""
        with self.lock:
            times = sorted(t for t, _attempt in self.arrivals if since <= t <= until)
        most, first = 0, 0
        for last, at in enumerate(times):
            while at - times[first] >= 1.0:
                first += 1
            most = max(most, last - first + 1)
        return most


def post_records(client: Any, line: str, count: int, prefix: str) -> set[str]:
    """Post `count` records to `line` (business numbers `prefix-n`); their ids."""
    ids = set()
    for n in range(count):
        response = client.post(f"/v1/{line}", json={"business_no": f"{prefix}-{n}"})
        assert response.status_code == 202, response.text
        ids.add(response.json()["id"])
    return ids
