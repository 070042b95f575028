"""`pytest -n N --dist loadgroup` by the groups tests/conftest.py gives the tests.

xdist's own loadgroup scheduler learns a test's group from a suffix its workers append to
the test's node id, and pytest 9 no longer reads the attribute xdist writes it to: every
test ended up alone, the groups ignored (tests that load the machine could run side by
side). Here each worker writes the groups it found to a file the controller named, and the
controller's scheduler, xdist's own for scopes, reads them from there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

# The key, in each worker's input, of the directory the workers write their groups to.
GROUPS_DIR = "run_groups_dir"


def write_groups(config: pytest.Config, groups: dict[str, str]) -> None:
    """On a worker: record each grouped test's group (node id: group) for the scheduler."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or GROUPS_DIR not in workerinput:
        return
    path = Path(workerinput[GROUPS_DIR]) / f"{workerinput['workerid']}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(groups))
    os.replace(partial, path)  # the scheduler never reads half a file


class RunGroupScheduling(LoadScopeScheduling):
    """xdist's scheduling by scope, a scope being a test's group, or the test alone: a
    group goes whole to one worker; the next unit goes to the first worker with at most
    two tests left, in the order the workers sorted the tests."""

    def __init__(self, config: pytest.Config, log: Producer | None, *, groups_dir: Path):
        super().__init__(config, log)
        self.groups_dir = groups_dir
        self.groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self.groups is None:
            # Read once all the workers have collected (their groups are written by then).
            self.groups = {}
            for path in sorted(self.groups_dir.glob("*.json")):
                self.groups.update(json.loads(path.read_text()))
        group = self.groups.get(nodeid)
        return f"group:{group}" if group else nodeid
