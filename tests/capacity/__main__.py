"""`python -m tests.capacity`, from the checkout: see `tests.capacity.cli`."""

from __future__ import annotations

import sys

from tests.capacity.cli import main

sys.exit(main())
