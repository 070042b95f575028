"""Alert throttling of point events (a record died, a replay finished; conditions are
incidents, `app.telemetry.incidents`): at most one message per key per window, carrying how
many events were folded into it. Pure: every call is handed the time."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Window:
    opened_s: float
    folded: int = 0
    last: Any = None


@dataclass
class Throttle:
    """Per-key windows. `offer` says whether an event is sent now; `due` releases the counts
    folded into windows that have closed, so a burst's tail is never lost."""

    window_s: float
    _windows: dict[Hashable, _Window] = field(default_factory=dict)

    def offer(self, key: Hashable, item: Any, *, now_s: float) -> int | None:
        """Returns the count to send with `item` now, or None when it was folded."""
        window = self._windows.get(key)
        if window is None or now_s - window.opened_s >= self.window_s:
            count = 1 + (window.folded if window else 0)
            self._windows[key] = _Window(opened_s=now_s)
            return count
        window.folded += 1
        window.last = item
        return None

    def due(self, *, now_s: float) -> list[tuple[Hashable, Any, int]]:
        """`(key, last folded item, count)` for every closed window that folded events."""
        released = []
        for key, window in self._windows.items():
            if window.folded and now_s - window.opened_s >= self.window_s:
                released.append((key, window.last, window.folded))
                self._windows[key] = _Window(opened_s=now_s)
        return released

    def drain(self) -> list[tuple[Hashable, Any, int]]:
        """`(key, last folded item, count)` for every window that folded events, closed or
        not: for a process that is going away, whose open windows would never close."""
        released = [(key, w.last, w.folded) for key, w in self._windows.items() if w.folded]
        self._windows.clear()
        return released
