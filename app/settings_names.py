"""The names of the settings' environment variables, and the closest one to a name that is
none of them: a misspelt `PIPELINE_` variable is ignored by the settings, so the command
line warns about it instead of letting it pass unseen."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from app.line_settings import LineSettings
from app.settings import DEFAULT_LINES, ENV_PREFIX, LINE_NAME, Settings

NESTED = "__"
# `PIPELINE_` variables that are not settings: the TOML file's name, and the mark a command
# leaves for the processes it starts once it has warned (`pipeline up`: one warning, not
# one per process).
CHECKED_VARIABLE = f"{ENV_PREFIX}ENVIRONMENT_CHECKED"
NOT_SETTINGS = (f"{ENV_PREFIX}CONFIG", CHECKED_VARIABLE)
# The test suite's own variables (e.g. PIPELINE_TEST_DATABASE_URL).
TEST_PREFIX = f"{ENV_PREFIX}TEST_"
# How alike a name must be to be offered (difflib's ratio; its own default).
CLOSE_ENOUGH = 0.6


@dataclass(frozen=True, kw_only=True)
class UnknownVariable:
    """A `PIPELINE_` variable no setting reads, and the known name closest to it, if any."""

    name: str
    closest: str | None

    def warning(self) -> str:
        """One line for the operator."""
        hint = f"; did you mean {self.closest}?" if self.closest else ""
        return f"{self.name} is not a setting and is ignored{hint}"


def _top_level() -> list[str]:
    return [f"{ENV_PREFIX}{field.upper()}" for field in Settings.model_fields]


def _line_variables(line: str) -> list[str]:
    stem = f"{ENV_PREFIX}LINES{NESTED}{line.upper()}{NESTED}"
    return [stem + field.upper() for field in LineSettings.model_fields]


def _dict_fields() -> set[str]:
    return {
        f"{ENV_PREFIX}{name.upper()}"
        for name, field in Settings.model_fields.items()
        if getattr(field.annotation, "__origin__", None) is dict
    }


def is_known(name: str) -> bool:
    """Whether a setting (or the pipeline itself) reads the variable `name`."""
    upper = name.upper()
    if upper in NOT_SETTINGS or upper.startswith(TEST_PREFIX) or upper in _top_level():
        return True
    head, _, rest = upper.partition(NESTED)
    if head == f"{ENV_PREFIX}LINES":
        # Read by the settings, which refuse a bad line name or an unknown line setting
        # (`load_settings` names the closest one).
        return True
    # A mapping may be given one key at a time: PIPELINE_INTAKE_KEYS__<KEY ID>.
    return bool(rest) and head in _dict_fields()


def closest_known(name: str) -> str | None:
    """The known variable most like `name`, if any is alike enough. Compared without the
    part they share: the prefix, and a line's `LINES__<LINE>__` (or `MAX_QUEUE_LENGTH`
    would look like any other line setting of that line)."""
    upper = name.upper()
    parts = upper.split(NESTED)
    if len(parts) == 3 and parts[0] == f"{ENV_PREFIX}LINES":
        stem = f"{parts[0]}{NESTED}{parts[1]}{NESTED}"
        fields = [field.upper() for field in LineSettings.model_fields]
        return _closest(parts[2], {field: stem + field for field in fields})
    named = parts[1].lower() if len(parts) == 3 else ""
    lines = [*DEFAULT_LINES, *([named] if LINE_NAME.match(named) else [])]
    candidates = _top_level() + [v for line in dict.fromkeys(lines) for v in _line_variables(line)]
    return _closest(
        upper.removeprefix(ENV_PREFIX), {c.removeprefix(ENV_PREFIX): c for c in candidates}
    )


def _closest(word: str, candidates: Mapping[str, str]) -> str | None:
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=CLOSE_ENOUGH)
    return candidates[found[0]] if found else None


def unknown_variables(environ: Mapping[str, str]) -> list[UnknownVariable]:
    """The `PIPELINE_` variables of `environ` that no setting reads, sorted by name."""
    names: Iterable[str] = sorted(environ)
    return [
        UnknownVariable(name=name, closest=closest_known(name))
        for name in names
        if name.upper().startswith(ENV_PREFIX) and not is_known(name)
    ]
