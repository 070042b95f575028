"""`/docs` in headless Chromium with no way to another host: every request the browser
makes to anything but this machine goes to a refusing proxy of the test's own
(`tests/support/egress.py`). The page must render the operations, the signing section and
the schemes from what the intake serves alone, and every request the page makes (as the
browser's network log records them) must go to the intake. Screenshots are saved under the
test's temporary directory (or in `PIPELINE_TEST_ARTIFACTS`, when it names one)."""

from __future__ import annotations

import json

import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser.conftest import chromium
from tests.support.egress import RefusingProxy

# HTTP and the browser: the journal's database plays no part.
pytestmark = pytest.mark.journal_independent

KEY_ID, SECRET = "docs-key", "docs-secret-of-16-bytes"
# A host that is not this machine (`.invalid` names nothing anywhere): what a CDN would be.
ELSEWHERE = "http://cdn.example.invalid/swagger-ui.css"


@pytest.fixture
def proxy():
    refusing = RefusingProxy().start()
    try:
        yield refusing
    finally:
        refusing.stop()


@pytest.fixture
def browser(tmp_path, proxy):
    """Chromium whose every request to another host goes to `proxy` (loopback addresses
    are never proxied, so the intake on 127.0.0.1 is reached directly)."""
    yield from chromium(tmp_path, flags=(f"--proxy-server={proxy.url}",), network_log=True)


def wait(driver, predicate, what: str, timeout_s: float = 30):
    try:
        return WebDriverWait(driver, timeout_s, poll_frequency=0.2).until(predicate)
    except TimeoutException:
        raise AssertionError(f"timed out waiting for {what}") from None


def requested(driver) -> list[str]:
    """The URLs the page asked for since the last call (from the browser's network log,
    which the browser's own background requests are not part of)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def elsewhere(urls: list[str], base: str) -> list[str]:
    """Those of `urls` on another host than the intake (data: and blob: URLs are none)."""
    return [
        url
        for url in urls
        if url.startswith(("http:", "https:", "ws:", "wss:")) and not url.startswith(base + "/")
    ]


def fetch_elsewhere(driver) -> str:
    """What a fetch from another host gives the page: 'refused', or what it read."""
    return driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0]).then(r => r.text().then(t => done('read ' + r.status + t)),"
        " () => done('refused'));",
        ELSEWHERE,
    )


def test_docs_render_the_operations_with_no_other_host_reachable(
    harness, browser, proxy, artifacts
):
    harness.configure(intake_keys=json.dumps({KEY_ID: SECRET}), admin_token="docs-admin-token-x")
    client = harness.start_intake()
    base = str(client.base_url).rstrip("/")
    document = client.get("/openapi.json").json()
    operations = [(m, p) for p, methods in document["paths"].items() for m in methods]

    # The browser cannot reach another host (the proxy sees it try), and the network log
    # sees what the page asked for.
    browser.get(base + "/healthz")
    assert fetch_elsewhere(browser) == "refused"
    assert f"GET {ELSEWHERE}" in proxy.requests()
    assert elsewhere(requested(browser), base) == [ELSEWHERE]

    browser.set_window_size(1280, 1000)
    browser.get(base + "/docs")
    blocks = wait(
        browser,
        lambda d: (
            (found := d.find_elements(By.CSS_SELECTOR, ".opblock"))
            and len(found) == len(operations)
            and found
        ),
        f"Swagger UI's {len(operations)} operations",
    )
    rendered = {
        (
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text.lower(),
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path"),
        )
        for block in blocks
    }
    assert rendered == set(operations)
    info = browser.find_element(By.CSS_SELECTOR, ".information-container").text
    assert "Signing a record" in info
    assert "HMAC-SHA256" in info
    browser.save_screenshot(str(artifacts / "docs-top.png"))
    # A lock on the admin endpoints, none on the open ones.
    audit = browser.find_element(By.ID, "operations-default-list_audit_v1_audit_get")
    assert audit.find_elements(By.CSS_SELECTOR, ".authorization__btn")
    health = browser.find_element(By.ID, "operations-default-healthz_healthz_get")
    assert not health.find_elements(By.CSS_SELECTOR, ".authorization__btn")

    # "Authorize" offers both schemes, each with its description.
    browser.find_element(By.CSS_SELECTOR, "button.authorize").click()
    dialog = wait(
        browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".modal-ux"), "the Authorize dialog"
    )[0]
    assert "adminToken" in dialog.text
    assert "requestSignature" in dialog.text
    assert "Authorization: Bearer" in dialog.text
    dialog.find_element(By.CSS_SELECTOR, "button.close-modal").click()

    # The signed operation, opened: its four headers, with their descriptions.
    order = browser.find_element(By.ID, "operations-default-post_record_order")
    order.find_element(By.CSS_SELECTOR, ".opblock-summary-control").click()
    table = wait(
        browser,
        lambda d: "X-Signature" in order.text and order,
        "the signed operation's parameters",
    )
    for header in ("X-Key-Id", "X-Timestamp", "X-Nonce", "X-Signature"):
        assert header in table.text, header
    assert "lowercase hex HMAC-SHA256" in table.text
    browser.execute_script("arguments[0].scrollIntoView()", order)
    browser.save_screenshot(str(artifacts / "docs-signed-operation.png"))
    urls = requested(browser)
    assert f"{base}/docs/assets/swagger-ui-bundle.js" in urls, urls
    assert f"{base}/openapi.json" in urls, urls
    assert elsewhere(urls, base) == []
