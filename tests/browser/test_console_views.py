"""The console's addresses and lists in headless Chromium, against a real intake, Redis,
journal and worker, and a downstream that refuses a bad SKU with 422 and its reason: a
record's address and a search's address open their views (filters filled in), back and
forward move between views, the Dead list selects rows, counts them in a dry run and
retries them (the API sees them retried and audited), the banner names a paused line, a
stale token refusal goes once a good token is used, and no view scrolls sideways. At
desktop and phone width; the screenshots are saved as artifacts."""

from __future__ import annotations

import json

import pytest
from selenium.webdriver.common.by import By

from app.journal.models import RecordStatus
from tests.browser.test_console import ADMIN, TOKEN, click, record_status
from tests.support.browser import (
    DESKTOP,
    PHONE,
    attr_of,
    enter_token,
    shoot,
    sideways_overflow,
    text_of,
    wait,
)
from tests.support.journal import journal_records
from tests.support.processes import wait_for
from tests.support.recorder import Received, _SmallServer

pytestmark = pytest.mark.journal_independent

BAD_SKU = "SKU-GONE"
REFUSAL = {"error": "unknown sku"}
VIEWS = ["#/", "#/alerts", "#/retries", "#/dead", "#/records", "#/schedules", "#/replay", "#/audit"]


class SkuShop(_SmallServer):
    """A downstream that answers 422 `{"error": "unknown sku"}` to a record whose payload
    names the bad SKU (until `mended`), and 200 to the rest."""

    mended = False

    def answer(self, method: str, received: Received) -> int:
        return 422 if received.body["payload"].get("sku") == BAD_SKU and not self.mended else 200

    def headers_for(self, received: Received) -> dict[str, str]:
        return {"content-type": "application/json"}

    def body_for(self, received: Received) -> bytes:
        return json.dumps(REFUSAL).encode() if received.answered == 422 else b"{}"


def go(driver, base: str, address: str) -> None:
    """Open `address` as a pasted URL: a fresh page load (so the token is asked again)."""
    driver.get("about:blank")  # else a new hash alone moves within the same page
    driver.get(base + "/" + address)
    wait(driver, lambda d: d.execute_script("return document.readyState") == "complete", address)


def shown(driver, css: str) -> bool:
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return bool(found) and found[0].is_displayed()


def rows(driver, css: str) -> list[str]:
    return [r.get_attribute("data-record") for r in driver.find_elements(By.CSS_SELECTOR, css)]


def cards(driver) -> list[str]:
    """The lines' cards shown, read at once (the page redraws them every 2 s)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#lines > [data-line]')].map(c => c.dataset.line)"
    )


def no_overflow(driver, where: str) -> None:
    overflow = sideways_overflow(driver)
    width = driver.get_window_size()["width"]
    assert overflow <= 0, f"{where} scrolls sideways by {overflow}px at {width} px"


@pytest.fixture
def shop():
    double = SkuShop().start()
    yield double
    double.stop()


@pytest.mark.parametrize(("size", "name"), [(DESKTOP, "desktop"), (PHONE, "phone")])
def test_the_console_views_have_addresses_lists_and_a_state_banner(
    harness, browser, artifacts, shop, size, name
):
    harness.configure(
        admin_token=TOKEN,
        lines__order__downstream_url=f"{shop.url}/orders",
        lines__order__max_attempts="2",
        lines__order__backoff_initial_s="0.2",
        lines__order__backoff_max_s="0.5",
    )
    client = harness.start_intake()
    harness.start_worker("order")
    harness.start_beat()
    bad = []
    for n in range(4):
        body = {"business_no": f"BAD-{n}", "sku": BAD_SKU, "note": "x" * 40}
        answer = client.post("/v1/order", json=body)
        assert answer.status_code == 202, answer.text
        bad.append(answer.json()["id"])
    assert (
        client.post("/v1/order", json={"business_no": "GOOD-1", "sku": "SKU-1"}).status_code == 202
    )
    for rid in bad:
        wait_for(
            lambda rid=rid: record_status(client, rid) == "dead",
            timeout_s=60,
            what=f"a dead record, not {client.get(f'/v1/records/{rid}', headers=ADMIN).text}",
        )
    # An operator paused refund: the page is degraded, and says why.
    paused = client.post("/v1/lines/refund/pause", json={"reason": "supplier audit"}, headers=ADMIN)
    assert paused.status_code == 200, paused.text
    base = str(client.base_url).rstrip("/")
    browser.set_window_size(*size)

    # The overview: the banner names the paused line and links to it.
    go(browser, base, "#/")
    enter_token(browser, TOKEN)
    wait(browser, lambda d: attr_of(d, "#state", "data-state") == "degraded", "degraded")
    reason = '#state-reasons li[data-code="paused"][data-line="refund"]'
    wait(browser, lambda d: "refund" in text_of(d, reason), "the paused line named")
    assert attr_of(browser, f"{reason} a", "href").endswith("#/lines/refund")
    card = '#lines [data-line="refund"]'
    wait(browser, lambda d: "trouble-warn" in attr_of(d, card, "class"), "refund's card amber")
    dead_link = '#lines [data-line="order"] li.trouble[data-status="dead"] a'
    wait(browser, lambda d: text_of(d, dead_link) == "dead 4", "order's four dead records")
    assert attr_of(browser, dead_link, "href").endswith("#/dead?line=order")
    # Every time shown: ISO 8601 UTC ending in Z, the local time in its title.
    times = browser.execute_script(
        "return [...document.querySelectorAll('main time')].map(t => [t.textContent, t.title])"
    )
    assert times
    for text, title in times:
        assert text.endswith("Z"), text
        assert title.startswith("local time"), title
    no_overflow(browser, "the overview")
    browser.execute_script("document.activeElement.blur()")
    shoot(browser, artifacts, f"console-{name}")

    # The banner's reason leads to the line; its dead count leads to the Dead list.
    click(browser, f"{reason} a")
    wait(browser, lambda d: d.current_url.endswith("#/lines/refund"), "the line's address")
    wait(browser, lambda d: text_of(d, "#lines-title") == "Line refund", "the line view")
    wait(browser, lambda d: cards(d) == ["refund"], "refund's card alone")
    browser.back()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, dead_link), "the overview again")
    click(browser, dead_link)
    wait(browser, lambda d: d.current_url.endswith("#/dead?line=order"), "the Dead list's address")
    listed = "#list-table tbody tr"
    wait(browser, lambda d: len(rows(d, listed)) == 4, "the four dead records")
    assert rows(browser, listed) == sorted(bad, reverse=True)  # newest first
    assert (
        browser.find_element(By.CSS_SELECTOR, "#list-filter select[name=line]").get_attribute(
            "value"
        )
        == "order"
    )
    first = text_of(browser, f'{listed}[data-record="{bad[-1]}"]')
    assert "BAD-3" in first
    assert "HTTP 422" in first
    assert "unknown sku" in first
    no_overflow(browser, "the Dead list")

    # The error filter narrows the list, and is in the address.
    field = browser.find_element(By.CSS_SELECTOR, "#list-filter input[name=error]")
    field.send_keys("UNKNOWN SKU")
    click(browser, "#list-filter button[type=submit]")
    wait(browser, lambda d: "error=UNKNOWN+SKU" in d.current_url, "the filter's address")
    wait(browser, lambda d: "containing" in text_of(d, "#list-result"), "the filtered list")
    assert len(rows(browser, listed)) == 4

    # Two rows selected: the dry run counts them, changes nothing; the run retries them.
    chosen = bad[-2:]
    for rid in chosen:
        click(browser, f'#list-table input.pick[data-record="{rid}"]')
    assert text_of(browser, "#list-selected") == "2"
    click(browser, "#list-dry")
    result = "#list-action-result"
    wait(browser, lambda d: text_of(d, result).startswith("Dry run:"), "the dry run's count")
    assert "2 would be retried" in text_of(browser, result)
    assert attr_of(browser, result, "data-count") == "2"
    assert {record_status(client, rid) for rid in chosen} == {"dead"}
    browser.execute_script(
        "arguments[0].scrollIntoView({block: 'center'})", browser.find_element(By.ID, "list-run")
    )
    shoot(browser, artifacts, "console-dead-list" + ("" if name == "desktop" else "-phone"))
    shop.mended = True
    click(browser, "#list-run")
    wait(browser, lambda d: text_of(d, result).startswith("Done:"), "the run's result")
    assert "2 of 2 record(s) retried" in text_of(browser, result)
    for rid in chosen:
        wait_for(lambda rid=rid: record_status(client, rid) == "done", timeout_s=40, what="done")
    assert {record_status(client, rid) for rid in bad[:2]} == {"dead"}
    audit = client.get("/v1/audit", headers=ADMIN).json()["items"]
    assert any("retry" in row["action"] for row in audit), audit
    wait(browser, lambda d: len(rows(d, listed)) == 2, "the list without the retried ones")

    # A record's link opens its view; back returns to the list, forward to the record.
    click(browser, f'#list-table a[data-record="{bad[0]}"]')
    wait(browser, lambda d: d.current_url.endswith(f"#/records/{bad[0]}"), "the record's address")
    wait(browser, lambda d: attr_of(d, "#detail", "data-status") == "dead", "the record")
    browser.back()
    wait(browser, lambda d: shown(d, "#list-view") and not shown(d, "#record-view"), "back")
    assert "error=UNKNOWN+SKU" in browser.current_url
    browser.forward()
    wait(browser, lambda d: shown(d, "#record-view") and not shown(d, "#list-view"), "forward")

    # A record's address pasted: its payload as JSON, each attempt's status and answer.
    go(browser, base, f"#/records/{bad[0]}")
    enter_token(browser, TOKEN)
    wait(browser, lambda d: attr_of(d, "#detail", "data-status") == "dead", "the pasted record")
    payload = json.loads(text_of(browser, "#payload"))
    assert payload["sku"] == BAD_SKU
    attempts = browser.find_elements(By.CSS_SELECTOR, "#detail-attempts tbody tr")
    assert [a.get_attribute("data-outcome") for a in attempts] == ["failed", "failed"]
    assert "422" in text_of(browser, "#detail-attempts tbody tr td.http")
    assert "unknown sku" in text_of(browser, "#detail-attempts tbody tr td.answer")
    no_overflow(browser, "the record view")
    shoot(browser, artifacts, f"record-{name}", full_page=True)
    browser.set_window_size(*size)

    # A search's address pasted: its filters filled in, its records listed.
    go(browser, base, "#/records?line=order&status=dead&error=unknown%20sku&order=newest")
    enter_token(browser, TOKEN)
    found = "#record-list tbody tr"
    wait(browser, lambda d: len(rows(d, found)) == 2, "the search's two dead records")
    assert rows(browser, found) == [bad[1], bad[0]]
    form = browser.find_element(By.ID, "search")
    values = {
        n: form.find_element(By.NAME, n).get_attribute("value")
        for n in ("line", "status", "error", "order")
    }
    assert values == {"line": "order", "status": "dead", "error": "unknown sku", "order": "newest"}
    no_overflow(browser, "the search")

    # Every view fits the width.
    for address in VIEWS:
        click(browser, f'nav a[href="{address}"]')
        wait(browser, lambda d, a=address: d.current_url.endswith(a), address)
        no_overflow(browser, address)


def test_a_stale_token_refusal_goes_once_a_good_token_is_used(harness, browser):
    harness.configure(admin_token=TOKEN)
    client = harness.start_intake()
    base = str(client.base_url).rstrip("/")
    browser.set_window_size(*DESKTOP)
    for address, result in (("#/schedules", "#schedules-result"), ("#/audit", "#audit-result")):
        go(browser, base, address)
        enter_token(browser, "not-the-token")
        wait(browser, lambda d, r=result: "not valid" in text_of(d, r), "the refusal")
        assert "not valid" in text_of(browser, "#token-state")
        enter_token(browser, TOKEN)
        wait(browser, lambda d, r=result: "not valid" not in text_of(d, r), "the refusal gone")
        wait(browser, lambda d: "not valid" not in text_of(d, "#token-state"), "token accepted")
        # A list refreshed (auto-refresh paused, then "refresh now") keeps it gone.
        click(browser, "#refresh-toggle")
        assert attr_of(browser, "#refresh-toggle", "aria-pressed") == "true"
        assert "paused" in text_of(browser, "#refresh-state")
        click(browser, "#refresh-now")
        wait(browser, lambda d: text_of(d, "#updated").startswith("updated"), "a refresh")
        assert "not valid" not in text_of(browser, result)


def test_a_large_payload_is_cut_and_said_so(harness, browser):
    harness.configure(admin_token=TOKEN)
    rt = harness.runtime()
    (big,) = journal_records(
        rt, [{"business_no": "BIG-1", "blob": "x" * 80_000}], line="order", status=RecordStatus.DEAD
    )
    client = harness.start_intake()
    browser.set_window_size(*PHONE)
    go(browser, str(client.base_url).rstrip("/"), f"#/records/{big}")
    enter_token(browser, TOKEN)
    wait(browser, lambda d: attr_of(d, "#detail", "data-status") == "dead", "the record")
    assert "Cut: the first 64 KiB" in text_of(browser, "#payload-note")
    shown_chars = browser.execute_script(
        "return document.querySelector('#payload').textContent.length"
    )
    assert 64 * 1024 <= shown_chars <= 64 * 1024 + 2
    no_overflow(browser, "a large payload")


def test_the_dead_list_pages_newest_first_and_counts_all_matching(harness, browser):
    harness.configure(admin_token=TOKEN)
    rt = harness.runtime()
    dead = journal_records(
        rt, [{"business_no": f"R-{n}"} for n in range(55)], line="refund", status=RecordStatus.DEAD
    )
    client = harness.start_intake()
    browser.set_window_size(*PHONE)
    go(browser, str(client.base_url).rstrip("/"), "#/dead?line=refund")
    enter_token(browser, TOKEN)
    listed = "#list-table tbody tr"
    wait(browser, lambda d: len(rows(d, listed)) == 50, "a first page of 50")
    assert "older ones on the next page" in text_of(browser, "#list-result")
    click(browser, "#list-older")
    wait(browser, lambda d: len(rows(d, listed)) == 55, "the older ones")
    assert rows(browser, listed) == sorted(dead, reverse=True)
    assert not shown(browser, "#list-older")
    # All matching the filter: the dry run counts every one, not the page.
    click(browser, "#list-actions input[name=scope][value=all]")
    click(browser, "#list-dry")
    result = "#list-action-result"
    wait(browser, lambda d: text_of(d, result).startswith("Dry run:"), "the dry run")
    assert "55 record(s) match; 55 would be retried" in text_of(browser, result)
    assert {record_status(client, rid) for rid in dead} == {"dead"}
    no_overflow(browser, "a long Dead list")
