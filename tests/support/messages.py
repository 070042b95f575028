"""Reading the task messages a line's queue holds."""

from __future__ import annotations

import base64
import json


def message_args(raw: bytes) -> object:
    """The task argument of a queued message: a record id, or a list of them."""
    args, _kwargs, _embed = json.loads(base64.b64decode(json.loads(raw)["body"]))
    return args[0]
