"""A line's per-sender intake rate: one sender's flood is slowed down or refused with 429,
journaling nothing of what was refused, while another sender on the same line is admitted."""

from __future__ import annotations

import json
import threading
import time

import httpx

from tests.support.harness import Harness, signed_headers
from tests.support.processes import wait_for

KEYS = {"shop-a": "s3cret-value-of-shop-a", "shop-b": "s3cret-value-of-shop-b"}


def test_one_senders_flood_gets_429_while_another_sender_on_the_line_is_admitted(
    harness: Harness,
) -> None:
    # Two order requests a second from each sender, each waiting at most a second: of a
    # burst of 16 from shop A, about three go through (a few more if the burst spreads out)
    # and the rest are refused at once. Shop B's two requests meanwhile have turns of their
    # own. The line has no line-wide rate.
    harness.configure(intake_keys=json.dumps(KEYS), lines__order__sender_intake_rate="2")
    client = harness.start_intake()
    answered: list[tuple[float, str, str, httpx.Response]] = []
    lock = threading.Lock()

    def post(sender: str, n: int) -> None:
        business_no = f"{sender}-{n}"
        body = json.dumps({"business_no": business_no}).encode()
        with httpx.Client(base_url=str(client.base_url), timeout=30) as own:
            answer = own.post(
                "/v1/order", content=body, headers=signed_headers(sender, KEYS[sender], body)
            )
        with lock:
            answered.append((time.monotonic(), sender, business_no, answer))

    flood = [threading.Thread(target=post, args=("shop-a", n)) for n in range(16)]
    for thread in flood:
        thread.start()
    wait_for(lambda: len(answered) > 0, timeout_s=30, what="a first answer to shop A")
    # While shop A's admitted requests still wait their turns.
    others = [threading.Thread(target=post, args=("shop-b", n)) for n in range(2)]
    for thread in others:
        thread.start()
    for thread in [*flood, *others]:
        thread.join(timeout=30)
    assert len(answered) == 18

    from_a = [(t, no, a) for t, sender, no, a in answered if sender == "shop-a"]
    from_b = [(t, no, a) for t, sender, no, a in answered if sender == "shop-b"]
    admitted_a = [(t, no, a) for t, no, a in from_a if a.status_code == 202]
    refused_a = [a for _, _, a in from_a if a.status_code != 202]
    assert 2 <= len(admitted_a) <= 8, [a.status_code for _, _, a in from_a]
    assert refused_a
    for answer in refused_a:
        assert answer.status_code == 429, answer.text
        assert answer.json()["error"]["code"] == "rate_limited"
        assert int(answer.headers["retry-after"]) >= 1
    # Shop B's own rate: both its requests admitted, the first while one of shop A's
    # admitted requests still waited its turn.
    assert [a.status_code for _, _, a in from_b] == [202, 202], [a.text for _, _, a in from_b]
    first_b_at = min(t for t, _, _ in from_b)
    assert any(at > first_b_at for at, _, _ in admitted_a)

    # Journaled: the admitted requests, each under its sender's key; nothing refused.
    journaled = {r.business_no: r for r in harness.records()}
    admitted = [(no, a) for _, no, a in [*admitted_a, *from_b]]
    assert set(journaled) == {no for no, _ in admitted}
    for no, answer in admitted:
        assert journaled[no].id == answer.json()["id"]
        assert journaled[no].sender == no.rpartition("-")[0]
