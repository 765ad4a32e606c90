"""The one logging configuration of codl: every module logs through ``logging.getLogger(__name__)``
(children of the ``codl`` logger); the CLI and the workflow scripts call :func:`configure` once.

The level comes from ``--log-level`` or ``$CODL_LOG_LEVEL`` (default INFO). :func:`configure`
writes the level it chose back into the environment, so the processes a run starts (spawned
ranks, srun tasks) log at the same level without being told again.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from codl.errors import CodlError

ENV = "CODL_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT = "INFO"
FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"
DATEFMT = "%Y-%m-%dT%H:%M:%S"


def level_of(name: str | None) -> str:
    """``name`` (any case) as a level name; a bad one is a one-line error listing the choices."""
    level = (name or os.environ.get(ENV) or DEFAULT).strip().upper()
    if level not in LEVELS:
        where = "--log-level" if name else f"${ENV}"
        raise CodlError(f"{where}: got {level.lower()!r}, expected one of {list(LEVELS)}")
    return level


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes, not when it was configured: the
    workflow scripts redirect stderr into the rule's log, and a test's captured stream goes away
    after the test (as ``logging.lastResort`` does)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure(level: str | None = None) -> logging.Logger:
    """Send the ``codl`` loggers' records at ``level`` and above to ``sys.stderr``.

    Called again (a test, a second ``main()`` in one process) it replaces its own handler instead
    of adding a second one.
    """
    chosen = level_of(level)
    os.environ[ENV] = chosen
    logger = logging.getLogger("codl")
    for handler in list(logger.handlers):
        if getattr(handler, "_codl", False):
            logger.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(FORMAT, DATEFMT))
    handler._codl = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(chosen)
    # The root logger stays the application's (pytest's capture, a notebook's own setup); codl's
    # records reach it too, but nothing here configures it.
    return logger
