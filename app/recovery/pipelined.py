"""Work through items in two stages at once, in their order: the next items' first stage
on other threads while this one runs the second stage of the item before them. Replay
claims the next pages of the journal (each in its own transaction, on its own
connection) while it pushes the page claimed before them."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def pipelined(
    items: Iterable[T],
    prepare: Callable[[T], R],
    finish: Callable[[R], None],
    *,
    ahead: int,
) -> None:
    """`finish(prepare(item))` for each item of `items`, finished in their order, always on
    the calling thread. With `ahead` > 0, up to `ahead` items are prepared at once on other
    threads while `finish` runs and while `items` yields the next; with 0, each is
    prepared and finished in turn on the calling thread.

    An error of `prepare`, `finish` or `items` is raised here once the prepares under way
    have ended (none is abandoned part-way, so none holds a transaction open); the items
    prepared and not finished are dropped, those not begun are never prepared."""
    if ahead <= 0:
        for item in items:
            finish(prepare(item))
        return
    with ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="pipelined") as pool:
        pending: deque[Future[R]] = deque()
        try:
            for item in items:
                pending.append(pool.submit(prepare, item))
                if len(pending) > ahead:
                    finish(pending.popleft().result())
            while pending:
                finish(pending.popleft().result())
        finally:
            for future in pending:
                future.cancel()
