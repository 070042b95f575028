"""The status page at `/`, in headless Chromium (Debian's chromium and chromium-driver,
driven by Selenium): three lines, a fuller bar for the line the test fills, the last alerts,
and a dry-run replay from the form. Screenshots at laptop and phone width are saved under
the test's temporary directory (or in `PIPELINE_TEST_ARTIFACTS`, when it names one)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import redis
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.support.services import require

# HTTP, Redis or the browser: the journal's database plays no part.
pytestmark = pytest.mark.journal_independent

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# The older switch that makes a missing browser a failure; CI=... now does it for every
# optional service (see tests/support/services.py).
REQUIRE_BROWSER = "PIPELINE_TEST_REQUIRE_BROWSER"
ADMIN_TOKEN = "page-admin-token"
# As root, with no network: no sandbox, and none of Chromium's own background connections.
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


@pytest.fixture
def browser(tmp_path):
    require(
        Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(),
        "Debian's chromium and chromium-driver are not installed (.ci/run installs them)",
        also_when=REQUIRE_BROWSER,
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"]:
        options.add_argument(flag)
    service = Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def artifacts(tmp_path) -> Path:
    """Where the screenshots go: never into the source tree unless asked to."""
    chosen = os.environ.get("PIPELINE_TEST_ARTIFACTS")
    directory = Path(chosen) if chosen else tmp_path / "artifacts"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def wait(driver, predicate, what: str, timeout_s: float = 20):
    try:
        return WebDriverWait(driver, timeout_s, poll_frequency=0.2).until(predicate)
    except TimeoutException:
        raise AssertionError(f"timed out waiting for {what}") from None


def fill(driver, line: str) -> float:
    bar = driver.find_element(By.CSS_SELECTOR, f'[data-line="{line}"] .fill')
    return float(bar.get_attribute("data-fill"))


def shown_lines(driver) -> list[str]:
    cards = driver.find_elements(By.CSS_SELECTOR, "#lines [data-line]")
    return [card.get_attribute("data-line") for card in cards]


def test_status_page_shows_lines_alerts_and_a_dry_run_replay(harness, browser, artifacts):
    harness.configure(
        admin_token=ADMIN_TOKEN,
        lines__refund__max_queue_length="40",
        lines__status__max_queue_length="3",
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

    browser.set_window_size(1280, 1000)
    browser.get(base + "/")
    wait(browser, lambda d: len(shown_lines(d)) == 3, "the three lines")
    assert shown_lines(browser) == ["order", "refund", "status"]
    assert fill(browser, "refund") == pytest.approx(75.0)
    assert fill(browser, "order") < 1
    assert fill(browser, "refund") > fill(browser, "order")
    assert fill(browser, "status") == pytest.approx(100.0)
    refund = browser.find_element(By.CSS_SELECTOR, '[data-line="refund"]').text
    assert "30 / 40 queued" in refund
    assert "enqueued 30" in refund
    status = browser.find_element(By.CSS_SELECTOR, '[data-line="status"]').text
    assert "deferred 2" in status
    assert "live workers\n0" in refund
    wait(browser, lambda d: "QUEUE_FULL" in d.find_element(By.ID, "alerts").text, "the alert")

    # The replay form: refused without the token, then a dry run with it.
    form = browser.find_element(By.ID, "replay")
    Select(form.find_element(By.NAME, "line")).select_by_value("refund")
    form.find_element(By.NAME, "token").send_keys("wrong-token")
    browser.find_element(By.ID, "replay-dry").click()
    result = browser.find_element(By.ID, "replay-result")
    wait(browser, lambda d: "refused" in result.text, "the refused replay")
    assert "admin token is not valid" in result.text
    token = form.find_element(By.NAME, "token")
    token.clear()
    token.send_keys(ADMIN_TOKEN)
    browser.find_element(By.ID, "replay-dry").click()
    wait(browser, lambda d: result.text.startswith("Dry run:"), "the dry run's counts")
    assert "matched 30, would enqueue 30" in result.text
    assert browser.find_element(By.ID, "replay-run").is_enabled()
    with redis.Redis.from_url(harness.env["PIPELINE_REDIS_URL"]) as r:
        assert r.llen("refund") == 30  # a dry run changes nothing

    # Nothing came from outside, and no payload or token reached the page.
    origins = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)"
    )
    assert set(origins) <= {base}, origins
    assert "PAYLOAD-SECRET-4111" not in browser.page_source
    desktop = artifacts / "status-page-desktop.png"
    assert browser.save_screenshot(str(desktop))

    browser.set_window_size(390, 844)
    browser.refresh()
    wait(browser, lambda d: len(shown_lines(d)) == 3, "the three lines at phone width")
    overflow = browser.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px at phone width"
    browser.execute_script("document.getElementById('lines').scrollIntoView()")
    phone = artifacts / "status-page-phone.png"
    assert browser.save_screenshot(str(phone))
    assert desktop.stat().st_size > 10_000
    assert phone.stat().st_size > 10_000
    print(f"\nscreenshots: {desktop} {phone}")
