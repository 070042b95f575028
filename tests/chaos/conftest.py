from __future__ import annotations

import pytest

from tests.chaos.stack import ChaosStack


@pytest.fixture
def chaos(harness, tmp_path):
    stack = ChaosStack(harness, tmp_path)
    try:
        yield stack
    finally:
        harness.close()  # stop the processes before their Redis
        stack.stop()
