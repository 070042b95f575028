"""docs/configuration.md is what `python -m app.config.reference` prints: every setting of
the model, its type, default and meaning, never a page that drifted from the code."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from app.config.line_settings import LineSettings
from app.config.reference import REGENERATE, meaning, reference
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


@pytest.mark.parametrize("model", [Settings, LineSettings])
def test_every_setting_of_the_model_carries_its_meaning_in_its_description(model) -> None:
    undescribed = [name for name, field in model.model_fields.items() if not field.description]
    assert undescribed == [], f"{model.__name__}: give these `Field(description=...)`"


def test_an_unset_default_reads_as_its_field_says() -> None:
    assert meaning(Settings, "intake_lines").unset == "all"
    assert "| comma-separated list | all |" in reference()


def test_a_setting_without_a_description_stops_the_reference_naming_it() -> None:
    class Undescribed(BaseModel):
        retries: int = 3

    with pytest.raises(KeyError, match=r"Undescribed\.retries: no description"):
        meaning(Undescribed, "retries")
