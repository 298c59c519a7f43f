"""The optional test dependencies (``tests/extras/*.sh``, ``make extras``): a test that needs
one skips without it, except under ``make test`` (``LOGITSPROC_REQUIRE_EXTRAS=1``), which
installs them, where a missing one is a failure."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

REQUIRED = os.environ.get("LOGITSPROC_REQUIRE_EXTRAS") == "1"


def missing(why: str) -> NoReturn:
    """Skip (or, when the extras are required, fail) for a missing extra."""
    if REQUIRED:
        pytest.fail(why)
    pytest.skip(why)


def import_extra(name: str, why: str) -> ModuleType:
    """``import name``, as ``missing`` says when it is not installed."""
    if REQUIRED:
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=why)
