"""docs/configuration.md is what `python -m app.config.reference` prints: every setting of
the model, its type, default and meaning, never a page that drifted from the code."""

from __future__ import annotations

from app.config.line_settings import LineSettings
from app.config.reference import REGENERATE, field_comments, reference
from app.config.settings import Settings
from tests.support.processes import REPO

PAGE = REPO / "docs" / "configuration.md"


def test_the_configuration_page_is_the_generated_reference() -> None:
    assert PAGE.read_text() == reference(), (
        f"docs/configuration.md is not what the settings model gives: regenerate it with "
        f"`{REGENERATE}`"
    )


def test_every_setting_of_the_model_has_a_row_with_its_variable() -> None:
    text = reference()
    for name in Settings.model_fields:
        assert f"| `PIPELINE_{name.upper()}` |" in text, name
    for name in LineSettings.model_fields:
        assert f"| `PIPELINE_LINES__<LINE>__{name.upper()}` |" in text, name


def test_a_setting_the_readme_never_described_takes_the_comment_above_its_field() -> None:
    comment = field_comments(Settings)["alert_buffer_size"]
    assert comment.startswith("Alerts waiting to be sent")
    assert comment.removesuffix(".") in reference()
