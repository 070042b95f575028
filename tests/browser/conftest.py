"""The browser tier's fixtures: a headless Chromium (Debian's chromium and chromedriver)
and the directory screenshots go to (`PIPELINE_TEST_ARTIFACTS`, else the test's own)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.support.services import require

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# The older switch that makes a missing browser a failure; CI=... now does it for every
# optional service (see tests/support/services.py).
REQUIRE_BROWSER = "PIPELINE_TEST_REQUIRE_BROWSER"
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
    "--force-device-scale-factor=1",
]


def chromium(
    tmp_path: Path, *, flags: tuple[str, ...] = (), network_log: bool = False
) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with `flags` besides the usual ones (`network_log`: keep every
    request a page makes, for `driver.get_log("performance")`); quit when done."""
    require(
        Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(),
        "Debian's chromium and chromium-driver are not installed (.ci/run installs them)",
        also_when=REQUIRE_BROWSER,
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    if network_log:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    for flag in [*CHROMIUM_FLAGS, *flags, f"--user-data-dir={tmp_path / 'chromium-profile'}"]:
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
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    yield from chromium(tmp_path)


@pytest.fixture
def artifacts(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where the screenshots go: never into the source tree unless asked to. Under
    `PIPELINE_TEST_ARTIFACTS`, in a directory named after the test."""
    chosen = os.environ.get("PIPELINE_TEST_ARTIFACTS")
    directory = Path(chosen) / request.node.name if chosen else tmp_path / "artifacts"
    directory.mkdir(parents=True, exist_ok=True)
    return directory
