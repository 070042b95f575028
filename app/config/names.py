"""The `PIPELINE_` variables of an environment that no setting reads: a misspelt variable is
ignored by the settings, so the command line warns about it, with the known name closest to
it, instead of letting it pass unseen."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from app.config.settings import ENV_PREFIX, NESTED, Settings, closest_known, top_level_variables

# `PIPELINE_` variables that are not settings: the TOML file's name, and the mark a command
# leaves for the processes it starts once it has warned (`pipeline up`: one warning, not
# one per process).
CHECKED_VARIABLE = f"{ENV_PREFIX}ENVIRONMENT_CHECKED"
NOT_SETTINGS = (f"{ENV_PREFIX}CONFIG", CHECKED_VARIABLE)
# The test suite's own variables (e.g. PIPELINE_TEST_DATABASE_URL).
TEST_PREFIX = f"{ENV_PREFIX}TEST_"


@dataclass(frozen=True, kw_only=True)
class UnknownVariable:
    """A `PIPELINE_` variable no setting reads, and the known name closest to it, if any."""

    name: str
    closest: str | None

    def warning(self) -> str:
        """One line for the operator."""
        hint = f"; did you mean {self.closest}?" if self.closest else ""
        return f"{self.name} is not a setting and is ignored{hint}"


def _dict_fields() -> set[str]:
    return {
        f"{ENV_PREFIX}{name.upper()}"
        for name, field in Settings.model_fields.items()
        if getattr(field.annotation, "__origin__", None) is dict
    }


def is_known(name: str) -> bool:
    """Whether a setting (or the pipeline itself) reads the variable `name`."""
    upper = name.upper()
    if upper in NOT_SETTINGS or upper.startswith(TEST_PREFIX) or upper in top_level_variables():
        return True
    head, _, rest = upper.partition(NESTED)
    if head == f"{ENV_PREFIX}LINES":
        # Read by the settings, which refuse a bad line name or an unknown line setting
        # (`load_settings` names the closest one).
        return True
    # A mapping may be given one key at a time: PIPELINE_INTAKE_KEYS__<KEY ID>.
    return bool(rest) and head in _dict_fields()


def unknown_variables(environ: Mapping[str, str]) -> list[UnknownVariable]:
    """The `PIPELINE_` variables of `environ` that no setting reads, sorted by name."""
    names: Iterable[str] = sorted(environ)
    return [
        UnknownVariable(name=name, closest=closest_known(name))
        for name in names
        if name.upper().startswith(ENV_PREFIX) and not is_known(name)
    ]
