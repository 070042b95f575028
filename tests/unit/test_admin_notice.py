"""What the intake and `pipeline up` say at start about the admin endpoints."""

from __future__ import annotations

from pydantic import SecretStr

from app.cli.main import admin_closed_notice
from app.config.settings import Settings

KEYS = {"shop-1": SecretStr("s3cret-value-of-shop-1")}


def test_keys_without_an_admin_token_close_the_admin_endpoints_and_the_notice_says_how_to_open():
    notice = admin_closed_notice(Settings(intake_keys=KEYS))
    assert notice is not None
    assert "closed" in notice
    assert "PIPELINE_ADMIN_TOKEN," in notice
    assert "PIPELINE_ADMIN_TOKENS" in notice


def test_no_notice_when_a_token_opens_them_or_dev_mode_does():
    token = SecretStr("a-token-0123456789")
    assert admin_closed_notice(Settings(intake_keys=KEYS, admin_token=token)) is None
    assert admin_closed_notice(Settings(intake_keys=KEYS, admin_tokens={"bob": token})) is None
    assert admin_closed_notice(Settings(dev_mode=True)) is None
