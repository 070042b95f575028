"""kombu's Redis transport as kombu ships it, without the workers' changes.

`workers.kombu_patches` replaces methods of `kombu.transport.redis` in place, once imported
by anything in the test process. The guards compare those methods with kombu's own, so they
load a second, private copy of the module from kombu's installed source: its classes are
kombu's code, untouched, and a `kombu.Connection` accepts its `Transport` as `transport=`."""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

MODULE = "kombu.transport.redis"


@functools.cache
def kombu_redis_as_shipped() -> ModuleType:
    """A fresh copy of `kombu.transport.redis`, not entered in `sys.modules`."""
    spec = importlib.util.find_spec(MODULE)
    assert spec is not None, f"{MODULE} is not installed"
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
