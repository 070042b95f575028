"""Driving the operator's console in headless Chromium (Debian's chromium and
chromium-driver, through Selenium): waits, the admin token, screenshots."""

from __future__ import annotations

from pathlib import Path

from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

DESKTOP = (1280, 1000)
PHONE = (390, 844)


def wait(driver: WebDriver, predicate, what: str, timeout_s: float = 20):
    """Poll `predicate(driver)` until it is truthy (a stale element counts as not yet)."""
    try:
        stale = [StaleElementReferenceException]
        return WebDriverWait(driver, timeout_s, poll_frequency=0.2, ignored_exceptions=stale).until(
            predicate
        )
    except TimeoutException:
        raise AssertionError(f"timed out waiting for {what}") from None


def text_of(driver: WebDriver, css: str) -> str:
    """The text of the first element `css` finds ("" when none), read again when the page
    redrew it meanwhile (it refreshes every 2 s)."""
    return attr_of(driver, css, None)


def attr_of(driver: WebDriver, css: str, name: str | None) -> str:
    """An attribute (`name`; None: the text) of the first element `css` finds ("" when
    none), read again when the page redrew it meanwhile."""
    for _ in range(10):
        try:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            if not found:
                return ""
            return found[0].text if name is None else (found[0].get_attribute(name) or "")
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{css} was redrawn ten times in a row while read")


def enter_token(driver: WebDriver, token: str) -> None:
    """Type the admin token into the header's form, as an operator does once per tab."""
    form = driver.find_element(By.ID, "token-form")
    before = int(form.get_attribute("data-sets") or 0)
    field = driver.find_element(By.ID, "token-input")
    field.clear()
    field.send_keys(token)
    field.send_keys("\n")  # Enter, as a keyboard user submits it
    wait(driver, lambda d: int(form.get_attribute("data-sets") or 0) > before, "the token")


def sideways_overflow(driver: WebDriver) -> int:
    """How many pixels the page scrolls sideways (0 when it fits its width)."""
    return int(
        driver.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
    )


def shoot(driver: WebDriver, directory: Path, name: str, *, full_page: bool = False) -> Path:
    """Save a screenshot as `<name>.png` in `directory`; with `full_page`, the whole page's
    height (the window is made as tall as the page first)."""
    path = directory / f"{name}.png"
    if full_page:
        width = driver.get_window_size()["width"]
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(width, min(int(height) + 120, 6000))
    assert driver.save_screenshot(str(path)), path
    assert path.stat().st_size > 10_000, f"{path} looks blank"
    return path


def color_of(driver: WebDriver, css: str, prop: str = "color") -> str:
    """A computed style of the first element `css` finds, read again when the page redrew
    it meanwhile."""
    for _ in range(10):
        try:
            element = driver.find_element(By.CSS_SELECTOR, css)
            script = f"return getComputedStyle(arguments[0])['{prop}']"
            return str(driver.execute_script(script, element))
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{css} was redrawn ten times in a row while read")


def resource_origins(driver: WebDriver) -> set[str]:
    """The origins of everything the page loaded."""
    return set(
        driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)"
        )
    )
