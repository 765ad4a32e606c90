"""Fixtures every test gets."""

from __future__ import annotations

import pytest

from codl.log import ENV


@pytest.fixture(autouse=True)
def _log_level_left_as_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """``codl.log.configure`` exports the level it chose (``$CODL_LOG_LEVEL``) so that the
    processes a run starts log alike. A test that calls ``main(["--log-level", "WARNING", ...])``
    in-process would otherwise silence the progress lines of every later test's subprocesses
    (test_workflow reads them from a run's log). Undone after each test, whatever set it."""
    monkeypatch.delenv(ENV, raising=False)
