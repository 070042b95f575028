"""The operator's console driven in headless Chromium against a real intake, Redis,
journal, worker and beat: a dead record followed from its alert to its view, to a retry,
to `done`; a cancel of a Dead list's records with its dry run first; a pause and a resume;
and the page at desktop and phone width, with trouble shown. Each saves its screenshots as
artifacts. (The addresses, lists and banner: test_console_views.py.)"""

from __future__ import annotations

import pytest
from selenium.common.exceptions import (
    ElementNotInteractableException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from sqlalchemy import update

from app.clock import utcnow
from app.delivery.outcomes import NOT_ATTEMPTED, circuit_open
from app.journal.models import RecordStatus, records
from app.schedules.cron import Misfire
from app.schedules.store import add
from app.telemetry.counters import Counter
from app.telemetry.events import Event
from tests.support.browser import (
    DESKTOP,
    PHONE,
    attr_of,
    color_of,
    enter_token,
    resource_origins,
    shoot,
    sideways_overflow,
    text_of,
    wait,
)
from tests.support.journal import journal_records
from tests.support.processes import wait_for
from tests.support.recorder import Recorder

# What the page shows and sends: the API's work on each journal database is tested by the
# integration tier on both; the page runs once, in the SQLite pass.
pytestmark = pytest.mark.journal_independent

TOKEN = "console-admin-token"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
# The colour of trouble on the page (--bad), as getComputedStyle gives it.
RED = "rgb(198, 40, 40)"


def click(driver, css: str, *, keyboard: bool = False) -> None:
    """Click what `css` finds (`keyboard`: focus it and press Enter), found again when the
    2 s refresh redrew it meanwhile."""
    for _ in range(10):
        try:
            element = driver.find_element(By.CSS_SELECTOR, css)
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
            if keyboard:
                element.send_keys("\n")
            else:
                element.click()
        except (StaleElementReferenceException, ElementNotInteractableException):
            continue  # redrawn meanwhile (a node taken out is not interactable either)
        else:
            return
    raise AssertionError(f"{css} was redrawn ten times in a row while clicked")


def _enter_on_the_focused_resume(driver) -> bool:
    """Press Enter on the focused element if it is a line's resume button; False when the
    2 s refresh redrew it between the two (a node taken out is not interactable: the key
    did not land), to be tried again."""
    try:
        focused = driver.switch_to.active_element
        if focused.get_attribute("data-action") != "resume":
            return False
        focused.send_keys("\n")
    except (StaleElementReferenceException, ElementNotInteractableException):
        return False
    return True


def open_console(browser, client, *, size=DESKTOP) -> str:
    base = str(client.base_url).rstrip("/")
    browser.set_window_size(*size)
    browser.get(base + "/")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#lines [data-line]"), "the lines")
    return base


def d_record(driver, css: str) -> str:
    return attr_of(driver, css, "data-record")


def record_status(client, record_id: str) -> str:
    return client.get(f"/v1/records/{record_id}", headers=ADMIN).json()["status"]


def test_a_dead_record_goes_from_its_alert_to_its_detail_to_a_retry_to_done(
    harness, browser, artifacts
):
    downstream = Recorder(status=500).start()
    try:
        harness.configure(
            admin_token=TOKEN,
            lines__order__downstream_url=f"{downstream.url}/orders",
            lines__order__max_attempts="2",
            lines__order__backoff_initial_s="0.2",
            lines__order__backoff_max_s="0.5",
        )
        client = harness.start_intake()
        harness.start_worker("order")
        harness.start_beat()
        answer = client.post("/v1/order", json={"business_no": "ORD-DEAD-1", "card": "SECRET-4111"})
        assert answer.status_code == 202, answer.text
        record_id = answer.json()["id"]
        wait_for(
            lambda: record_status(client, record_id) == "dead", timeout_s=60, what="a dead record"
        )

        open_console(browser, client)
        enter_token(browser, TOKEN)
        # The line shows its dead record as trouble, in red, and the health strip is green.
        dead_chip = '#lines [data-line="order"] li.trouble[data-status="dead"]'
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, dead_chip), "dead as trouble")
        assert color_of(browser, dead_chip, "background-color") == RED
        wait(
            browser,
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "#checks .check.ok")) == 5,
            "every part healthy (beat and sweeper running)",
        )
        assert "holds the lock" in text_of(browser, '#checks [data-check="beat"]')
        # The TASK_DEAD alert names the record, with its reason and figures.
        alert_css = '#alerts [data-event="TASK_DEAD"]'
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, alert_css), "the TASK_DEAD alert")
        alert = text_of(browser, alert_css)
        assert f"record {record_id} (ORD-DEAD-1) is dead after 2 attempts" in alert
        assert "attempts=2" in alert
        # The chart counts the two failed attempts the worker made.
        chart = '#lines [data-line="order"] .chart'
        wait(browser, lambda d: "failed 2" in text_of(d, chart), "the failed attempts charted")
        shoot(browser, artifacts, "1-dead-alert")

        click(browser, f'{alert_css} a.open-record[data-record="{record_id}"]')
        wait(browser, lambda d: d.current_url.endswith(f"#/records/{record_id}"), "its address")
        wait(browser, lambda d: d.find_element(By.ID, "detail").is_displayed(), "the record")
        detail = browser.find_element(By.ID, "detail")
        wait(browser, lambda d: detail.get_attribute("data-status") == "dead", "its status")
        assert detail.get_attribute("data-status") == "dead"
        assert browser.switch_to.active_element == detail  # focus follows, for the keyboard
        # Read in one script: the detail is drawn again at each refresh (every 2 s).
        attempts = browser.execute_script(
            "return [...document.querySelectorAll('#detail-attempts tbody tr')]"
            ".map(r => [r.dataset.outcome, r.textContent])"
        )
        assert [outcome for outcome, _ in attempts] == ["failed", "failed"]
        assert "HTTP 500" in attempts[0][1]
        assert "bytes" in text_of(browser, '#detail-fields [data-field="payload size"]')
        assert '"card": "SECRET-4111"' in text_of(browser, "#payload")  # pretty JSON
        text, when = browser.execute_script(
            "const t = document.querySelector('#detail-attempts time');"
            "return [t.textContent, t.getAttribute('datetime')]"
        )
        assert text == when
        assert text.endswith("Z")
        shoot(browser, artifacts, "2-dead-detail")

        # The downstream is mended; the operator retries the record from its detail.
        downstream.status = 200
        reason = browser.find_element(By.CSS_SELECTOR, "#record-actions input[name=reason]")
        reason.send_keys("downstream fixed")
        click(browser, "#record-retry")
        wait(browser, lambda d: detail.get_attribute("data-status") == "done", "done", 40)
        assert "Retried" in text_of(browser, "#action-result")
        audit = text_of(browser, "#detail-audit")
        assert "admin retry" in audit
        assert "downstream fixed" in audit
        outcomes = browser.execute_script(
            "return [...document.querySelectorAll('#detail-attempts tbody tr')]"
            ".map(r => r.dataset.outcome)"
        )
        assert outcomes == ["failed", "failed", "done"]
        assert [r.answered for r in downstream.snapshot()] == [500, 500, 200]
        shoot(browser, artifacts, "3-retried-done")
        browser.back()  # to the overview, where the alert was
        wait(browser, lambda d: "done 1" in text_of(d, chart), "the delivery charted")
        assert resource_origins(browser) <= {str(client.base_url).rstrip("/")}
    finally:
        downstream.stop()


def test_a_bulk_cancel_counts_first_asks_a_reason_and_shows_what_it_did(
    harness, browser, artifacts
):
    harness.configure(admin_token=TOKEN)
    rt = harness.runtime()
    dead = journal_records(
        rt, [{"business_no": f"R-{n}"} for n in range(3)], line="refund", status=RecordStatus.DEAD
    )
    (other,) = journal_records(rt, [{"business_no": "O-1"}], line="order", status=RecordStatus.DEAD)
    client = harness.start_intake()
    open_console(browser, client)
    enter_token(browser, TOKEN)

    # The line's dead count links to its Dead list.
    link = '#lines [data-line="refund"] li.trouble[data-status="dead"] a'
    wait(browser, lambda d: text_of(d, link) == "dead 3", "refund's three dead records")
    click(browser, link)
    rows = "#list-table tbody tr"
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 3, "the three")
    found = browser.find_elements(By.CSS_SELECTOR, rows)
    newest_first = sorted(dead, reverse=True)
    assert [row.get_attribute("data-record") for row in found] == newest_first

    # All matching the filter (refund's dead), cancelled: a reason first, then a count.
    form = browser.find_element(By.ID, "list-actions")
    click(browser, "#list-actions input[name=scope][value=all]")
    Select(form.find_element(By.NAME, "action")).select_by_value("cancel")
    result = browser.find_element(By.ID, "list-action-result")
    click(browser, "#list-dry")
    wait(browser, lambda d: "reason is required" in result.text, "the reason asked for")
    form.find_element(By.NAME, "reason").send_keys("customer withdrew")
    click(browser, "#list-dry")
    wait(browser, lambda d: result.text.startswith("Dry run:"), "the dry run's count")
    assert "3 record(s) match; 3 would be cancelled" in result.text
    run = browser.find_element(By.ID, "list-run")
    assert run.is_enabled()
    assert run.text == "Cancel 3 record(s)"
    assert {record_status(client, rid) for rid in dead} == {"dead"}  # a dry run changes nothing
    shoot(browser, artifacts, "1-bulk-dry-run")

    run.click()
    wait(browser, lambda d: result.text.startswith("Done:"), "the real run's result")
    assert "3 of 3 record(s) cancelled" in result.text
    assert not run.is_enabled()
    assert {record_status(client, rid) for rid in dead} == {"cancelled"}
    assert record_status(client, other) == "dead"  # another line is not touched
    wait(browser, lambda d: "No dead record on refund" in text_of(d, "#list-result"), "emptied")
    audit = client.get("/v1/audit", headers=ADMIN).json()["items"]
    assert [(a["action"], a["reason"]) for a in audit] == [("cancel", "customer withdrew")]
    click(browser, 'nav a[href="#/audit"]')
    wait(
        browser,
        lambda d: "customer withdrew" in text_of(d, "#audit-table"),
        "the audit log on the page",
        timeout_s=20,
    )
    shoot(browser, artifacts, "2-bulk-cancelled")

    # The search: by business number, and a time that is not one is refused with why.
    click(browser, 'nav a[href="#/records"]')
    search = browser.find_element(By.ID, "search")
    search.find_element(By.NAME, "business_no").send_keys("R-1")
    search.find_element(By.NAME, "since").send_keys("yesterday")
    click(browser, "#search button[type=submit]")
    wait(browser, lambda d: "Search refused" in text_of(d, "#search-result"), "the refusal")
    assert "not an ISO 8601 time" in text_of(browser, "#search-result")
    search.find_element(By.NAME, "since").clear()
    click(browser, "#search button[type=submit]")
    wait(browser, lambda d: "1 record(s) shown" in text_of(d, "#search-result"), "one record")
    assert d_record(browser, "#record-list tbody tr") == dead[1]
    assert browser.current_url.endswith("#/records?business_no=R-1")

    # One record, found by its id: a cancel asks for a reason, then says what it did.
    search.find_element(By.NAME, "business_no").clear()
    search.find_element(By.NAME, "id").send_keys(other)
    click(browser, "#search button[type=submit]")
    wait(browser, lambda d: d.current_url.endswith(f"#/records/{other}"), "its address")
    detail = browser.find_element(By.ID, "detail")
    wait(browser, lambda d: detail.get_attribute("data-status") == "dead", "the record's detail")
    click(browser, "#record-cancel")
    wait(browser, lambda d: "reason is required" in text_of(d, "#action-result"), "the ask")
    assert record_status(client, other) == "dead"
    browser.find_element(By.CSS_SELECTOR, "#record-actions input[name=reason]").send_keys("dup")
    click(browser, "#record-cancel")
    wait(browser, lambda d: detail.get_attribute("data-status") == "cancelled", "the cancel")
    assert "Cancelled at" in text_of(browser, "#action-result")
    assert "(reason: dup)" in text_of(browser, "#detail-audit")
    assert not browser.find_element(By.ID, "record-cancel").is_enabled()
    assert record_status(client, other) == "cancelled"
    shoot(browser, artifacts, "3-one-cancelled")


def test_a_schedule_is_disabled_and_enabled_and_the_token_is_never_stored(
    harness, browser, artifacts
):
    harness.configure(admin_token=TOKEN)
    rt = harness.runtime()
    with rt.engine.begin() as conn:
        add(
            conn,
            name="nightly-report",
            cron="30 2 * * *",
            timezone="Asia/Shanghai",
            line="order",
            payload={},
            misfire=Misfire.FIRE_ONCE,
            catchup_window_s=3600,
            now=utcnow(),
        )
    client = harness.start_intake()
    open_console(browser, client)
    click(browser, 'nav a[href="#/schedules"]')
    wait(browser, lambda d: "Needs the admin token" in text_of(d, "#schedules-result"), "the ask")
    enter_token(browser, TOKEN)
    row = '#schedules-table tr[data-schedule="nightly-report"]'
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row), "the schedule")
    shown = text_of(browser, row)
    for part in ("30 2 * * *", "Asia/Shanghai", "fire_once", "order", "yes"):
        assert part in shown
    ((shown_at, iso),) = wait(
        browser,
        lambda d: [
            (t.text, t.get_attribute("datetime"))
            for t in d.find_elements(By.CSS_SELECTOR, f"{row} time")
        ][-1:],
        "the next fire",
    )
    assert shown_at.endswith(":30:00Z")  # 02:30 in Shanghai is 18:30 UTC
    assert shown_at == iso

    click(browser, f'{row} button[data-schedule="nightly-report"]')
    wait(browser, lambda d: "Enable nightly-report" in text_of(d, row), "the disable")
    listed = client.get("/v1/schedules", headers=ADMIN).json()["items"]
    assert listed[0]["enabled"] is False
    click(browser, f'{row} button[data-schedule="nightly-report"]')
    wait(browser, lambda d: "Disable nightly-report" in text_of(d, row), "the enable")
    shoot(browser, artifacts, "1-schedules")
    click(browser, 'nav a[href="#/audit"]')
    wait(browser, lambda d: "schedule_enable" in text_of(d, "#audit-table"), "the audit rows", 20)
    assert "schedule_disable" in text_of(browser, "#audit-table")
    browser.back()  # to the schedules
    wait(browser, lambda d: d.current_url.endswith("#/schedules"), "the schedules again")

    # The token lives in the page's memory only: no storage, no cookie, not in the DOM.
    stored = browser.execute_script(
        "return [localStorage.length, sessionStorage.length, document.cookie]"
    )
    assert stored == [0, 0, ""]
    assert TOKEN not in browser.page_source
    browser.refresh()  # a new page: the token is asked for again
    wait(
        browser,
        lambda d: "needs the admin token" in text_of(d, "#token-state"),
        "the token asked for again",
    )
    assert "Needs the admin token" in text_of(browser, "#schedules-result")
    assert "Token set" not in text_of(browser, "#token-state")


def test_a_line_is_paused_and_resumed_from_the_console(harness, browser, artifacts):
    harness.configure(admin_token=TOKEN)
    client = harness.start_intake()
    open_console(browser, client)
    card = '#lines [data-line="status"]'

    # Without the token the pause is refused, and the page asks for the token.
    click(browser, f'{card} button[data-action="pause"]')
    wait(browser, lambda d: "refused" in text_of(d, "#line-result"), "the refusal")
    assert "needs the admin token" in text_of(browser, "#token-state")
    enter_token(browser, TOKEN)
    # Keyboard: focus the button and press Enter.
    click(browser, f'{card} button[data-action="pause"]', keyboard=True)
    wait(browser, lambda d: "PAUSED" in text_of(d, card), "the paused badge")
    assert "by admin" in text_of(browser, card)
    assert client.get("/v1/lines").json()["lines"][2]["paused"] is True
    shoot(browser, artifacts, "1-paused")

    # The page refreshes every 2 s; the keyboard's place stays on the line's button.
    wait(
        browser,
        lambda d: d.switch_to.active_element.get_attribute("data-action") == "resume",
        "the focus on the resume button, across refreshes",
    )
    wait(browser, _enter_on_the_focused_resume, "Enter on the focused resume button")
    wait(browser, lambda d: "PAUSED" not in text_of(d, card), "the resume")
    assert client.get("/v1/lines").json()["lines"][2]["paused"] is False
    actions = [a["action"] for a in client.get("/v1/audit", headers=ADMIN).json()["items"]]
    assert actions == ["resume", "pause"]
    shoot(browser, artifacts, "2-resumed")


@pytest.mark.parametrize(("width", "name"), [(DESKTOP, "desktop"), (PHONE, "phone")])
def test_the_console_shows_trouble_at_desktop_and_phone_width(
    harness, browser, artifacts, width, name
):
    harness.configure(admin_token=TOKEN, lines__refund__max_queue_length="20")
    rt = harness.runtime()
    journal_records(
        rt, [{"business_no": f"D-{n}"} for n in range(2)], line="order", status=RecordStatus.DEAD
    )
    journal_records(rt, [{"business_no": "F-1"}], line="order", status=RecordStatus.FAILED)
    # Failed without spending an attempt: it waits for its downstream (the circuit is open).
    (waiting,) = journal_records(
        rt, [{"business_no": "W-1"}], line="order", status=RecordStatus.FAILED
    )
    with rt.engine.begin() as conn:
        why = NOT_ATTEMPTED + circuit_open("order")
        conn.execute(update(records).where(records.c.id == waiting).values(last_error=why))
    journal_records(
        rt, [{"business_no": f"K-{n}"} for n in range(5)], line="order", status=RecordStatus.DONE
    )
    # A minute of outcomes for the chart, as workers count them.
    rt.telemetry.count(Counter.DONE, 4, line="order")
    rt.telemetry.count(Counter.FAILED, line="order")
    rt.telemetry.count(Counter.DEAD, line="order")
    assert rt.telemetry.flush()
    rt.alerts.raise_event(
        Event.TASK_DEAD,
        line="order",
        message="record 01EXAMPLE (D-0) is dead after 8 attempts",
        record_id="01EXAMPLE",
        attempts=8,
    )
    client = harness.start_intake()
    for n in range(15):
        assert client.post("/v1/refund", json={"business_no": f"RF-{n}"}).status_code == 202
    rt.alerts.close()
    rt.telemetry.flush()

    open_console(browser, client, size=width)
    enter_token(browser, TOKEN)
    dead = '#lines [data-line="order"] li.trouble[data-status="dead"] a'
    failed = '#lines [data-line="order"] li.trouble[data-status="failed"] a'
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, failed), "failed as trouble")
    wait(browser, lambda d: text_of(d, dead) == "dead 2", "order's two dead records")
    assert color_of(browser, '#lines [data-line="order"] li.trouble', "background-color") == RED
    assert not browser.find_elements(By.CSS_SELECTOR, '#lines li.trouble[data-status="done"]')
    # Refund has work and no worker: its card is red, with the page's reason for it.
    refund = '#lines [data-line="refund"]'
    wait(browser, lambda d: "trouble-bad" in attr_of(d, refund, "class"), "refund in trouble")
    assert "no worker is alive" in text_of(browser, f"{refund} .trouble-notes")
    assert attr_of(browser, "#state", "data-state") == "degraded"
    # No beat runs: the health strip says so, in red, with the reason.
    beat = '#checks [data-check="beat"]'
    wait(browser, lambda d: "FAIL" in text_of(d, beat), "the beat's failure")
    assert "no beat holds the lock" in text_of(browser, beat)
    assert "fail" in attr_of(browser, beat, "class")
    wait(browser, lambda d: "done 4" in text_of(d, '[data-line="order"] .chart'), "the chart")
    assert "failed 2" in text_of(browser, '[data-line="order"] .chart')
    wait(browser, lambda d: "TASK_DEAD" in text_of(d, "#alerts"), "the alert")
    wait(
        browser,
        lambda d: all(
            t.text == t.get_attribute("datetime") and t.text.endswith("Z")
            for t in d.find_elements(By.CSS_SELECTOR, "#alerts time")
        ),
        "the alerts' times in UTC, ISO 8601",
    )
    overflow = sideways_overflow(browser)
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px at {width[0]} px"
    browser.execute_script("document.activeElement.blur()")
    shoot(browser, artifacts, f"trouble-{name}")
    if name == "phone":
        # A tall phone: the header, the health strip and the first line's card.
        browser.set_window_size(PHONE[0], 1500)
        shoot(browser, artifacts, "trouble-phone-tall")
        browser.execute_script("document.getElementById('lines-title').scrollIntoView()")
        shoot(browser, artifacts, "trouble-phone-lines")
    else:
        shoot(browser, artifacts, "trouble-desktop-full", full_page=True)
    # The trouble links to those records: the Dead and the Retries lists of the line.
    click(browser, dead)
    rows = "#list-table tbody tr"
    wait(browser, lambda d: d.current_url.endswith("#/dead?line=order"), "the Dead list")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 2, "the dead records")
    browser.back()
    click(browser, failed)
    wait(browser, lambda d: d.current_url.endswith("#/retries?line=order"), "the Retries list")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 2, "the failed ones")
    # In the search, a failed attempt stays FAILED, in red; a record waiting for its
    # downstream without spending an attempt is shown waiting, not as a failure.
    click(browser, 'nav a[href="#/records"]')
    search = browser.find_element(By.ID, "search")
    Select(search.find_element(By.NAME, "line")).select_by_value("order")
    Select(search.find_element(By.NAME, "status")).select_by_visible_text("failed")
    click(browser, "#search button[type=submit]")
    rows = "#record-list tbody tr"
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 2, "the failed ones")
    statuses = {r.text for r in browser.find_elements(By.CSS_SELECTOR, f"{rows} td.status")}
    assert statuses == {"FAILED", "waiting for downstream"}
    assert color_of(browser, f"{rows} td.status-failed", "color") == RED
    assert color_of(browser, f"{rows} td.status-waiting", "color") != RED
    overflow = sideways_overflow(browser)
    assert overflow <= 0, f"the search scrolls sideways by {overflow}px at {width[0]} px"
