"""The console's overview at `/`, in headless Chromium: three lines, a fuller bar for the
line the test fills, the last alerts, and a dry-run replay from the form (refused with a
wrong token, counted with the right one). Nothing is fetched from elsewhere and no
payload reaches the page. Screenshots at laptop and phone width are saved as artifacts."""

from __future__ import annotations

import pytest
import redis
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.support.browser import (
    DESKTOP,
    PHONE,
    attr_of,
    enter_token,
    resource_origins,
    shoot,
    sideways_overflow,
    text_of,
    wait,
)

# HTTP, Redis or the browser: the journal's database plays no part.
pytestmark = pytest.mark.journal_independent

ADMIN_TOKEN = "page-admin-token"


def fill(driver, line: str) -> float:
    return float(attr_of(driver, f'#lines [data-line="{line}"] .fill', "data-fill"))


def shown_lines(driver) -> list[str]:
    """The lines' cards, read at once (the page redraws them every 2 s)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#lines > [data-line]')].map(c => c.dataset.line)"
    )


def test_status_page_shows_lines_alerts_and_a_dry_run_replay(harness, browser, artifacts):
    harness.configure(
        admin_token=ADMIN_TOKEN,
        lines__refund__max_queue_length="40",
        lines__refund__sender_queue_share="1",
        lines__status__max_queue_length="3",
        lines__status__sender_queue_share="1",
    )
    client = harness.start_intake()
    # No workers: what is posted stays queued. Refund fills to 30 of 40.
    for n in range(30):
        body = {"business_no": f"RF-{n}", "card": "PAYLOAD-SECRET-4111"}
        assert client.post("/v1/refund", json=body).status_code == 202
    for n in range(2):
        assert client.post("/v1/order", json={"business_no": f"ORD-{n}"}).status_code == 202
    # Status goes past its bound of 3: two records are deferred and QUEUE_FULL is raised.
    for n in range(5):
        body = {"business_no": f"ORD-{n}", "status": "paid", "occurred_at": "2026-11-29T10:00:00Z"}
        assert client.post("/v1/status", json=body).status_code == 202
    base = str(client.base_url).rstrip("/")

    browser.set_window_size(*DESKTOP)
    browser.get(base + "/")
    wait(browser, lambda d: len(shown_lines(d)) == 3, "the three lines")
    assert shown_lines(browser) == ["order", "refund", "status"]
    assert fill(browser, "refund") == pytest.approx(75.0)
    assert fill(browser, "order") < 1
    assert fill(browser, "refund") > fill(browser, "order")
    assert fill(browser, "status") == pytest.approx(100.0)
    refund = text_of(browser, '#lines [data-line="refund"]')
    assert "30 / 40 records queued (30 messages)" in refund
    assert "enqueued 30" in refund
    status = text_of(browser, '#lines [data-line="status"]')
    assert "deferred 2" in status
    assert "live workers\n0" in refund
    # Its one sender (dev mode's unsigned requests), within its fair share.
    assert text_of(browser, '#lines [data-line="refund"] .senders [data-sender="dev"]') == "dev: 30"
    # The alerts name records and actors: they wait for the admin token.
    wait(browser, lambda d: "admin token" in d.find_element(By.ID, "alerts").text, "a token ask")
    enter_token(browser, ADMIN_TOKEN)
    wait(browser, lambda d: "QUEUE_FULL" in d.find_element(By.ID, "alerts").text, "the alert")
    alert = text_of(browser, '#alerts [data-event="QUEUE_FULL"]')
    assert "is full (3/3); policy defer" in alert  # its reason
    assert "limit=3" in alert  # and its figures
    # Open incidents first (with how long they have been open), then resolved ones, then
    # point events.
    states = [
        item.get_attribute("data-state")
        for item in browser.find_elements(By.CSS_SELECTOR, "#alerts > li[data-state]")
    ]
    rank = {"open": 0, "resolved": 1, "event": 2}
    assert states == sorted(states, key=rank.__getitem__), states
    if "open" in states:
        assert "open for" in browser.find_element(By.CSS_SELECTOR, "#alerts > li.alert-open").text

    # The replay form (its own view): refused with a wrong token, then a dry run with the
    # right one.
    browser.find_element(By.CSS_SELECTOR, 'nav a[href="#/replay"]').click()
    wait(browser, lambda d: d.find_element(By.ID, "replay").is_displayed(), "the replay view")
    enter_token(browser, "wrong-token")
    form = browser.find_element(By.ID, "replay")
    Select(form.find_element(By.NAME, "line")).select_by_value("refund")
    browser.find_element(By.ID, "replay-dry").click()
    result = browser.find_element(By.ID, "replay-result")
    wait(browser, lambda d: "refused" in result.text, "the refused replay")
    assert "admin token is not valid" in result.text
    enter_token(browser, ADMIN_TOKEN)
    browser.find_element(By.ID, "replay-dry").click()
    wait(browser, lambda d: result.text.startswith("Dry run:"), "the dry run's counts")
    assert "matched 30, would enqueue 30" in result.text
    assert browser.find_element(By.ID, "replay-run").is_enabled()
    with redis.Redis.from_url(harness.env["PIPELINE_REDIS_URL"]) as r:
        assert r.llen("refund") == 30  # a dry run changes nothing

    # The record browser pages by keyset: 25 records, then the next page.
    browser.find_element(By.CSS_SELECTOR, 'nav a[href="#/records"]').click()
    search = browser.find_element(By.ID, "search")
    Select(search.find_element(By.NAME, "line")).select_by_value("refund")
    search.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    rows = "#record-list tbody tr"
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 25, "a first page")
    browser.find_element(By.ID, "next-page").click()
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 30, "the next page")
    assert not browser.find_element(By.ID, "next-page").is_displayed()
    ids = [row.get_attribute("data-record") for row in browser.find_elements(By.CSS_SELECTOR, rows)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 30

    # Nothing came from outside, and no payload or token reached the page.
    assert resource_origins(browser) <= {base}
    assert "PAYLOAD-SECRET-4111" not in browser.page_source
    assert ADMIN_TOKEN not in browser.page_source
    desktop = shoot(browser, artifacts, "status-page-desktop")

    browser.set_window_size(*PHONE)
    browser.get(base + "/#/")
    browser.refresh()
    wait(browser, lambda d: len(shown_lines(d)) == 3, "the three lines at phone width")
    overflow = sideways_overflow(browser)
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px at phone width"
    browser.execute_script("document.getElementById('lines').scrollIntoView()")
    phone = shoot(browser, artifacts, "status-page-phone")
    print(f"\nscreenshots: {desktop} {phone}")
