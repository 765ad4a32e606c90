"""Project exceptions.

Every error a user can cause names the offending key path or file and what was expected, so that
a typo in a sweep fails in seconds instead of hours into a cluster allocation.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_PROBLEMS_SHOWN = 50
MAX_PROBLEM_CHARS = 500


def _clip(text: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class CodlError(Exception):
    """Base class of all errors raised deliberately by codl."""


class ConfigError(CodlError):
    """One or more problems in a configuration, reported together.

    ``problems`` holds one human line per problem (``key.path: got X, expected Y``) so that a user
    fixes every mistake of a config in one round trip.
    """

    def __init__(self, problems: Iterable[str], *, source: str | None = None) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        self.source = source
        where = f" in {source}" if source else ""
        # Bounded: a generated or hostile config can have millions of problems, and the message
        # is printed whole by the CLI and by Snakemake.
        shown = [_clip(p) for p in self.problems[:MAX_PROBLEMS_SHOWN]]
        more = len(self.problems) - len(shown)
        lines = "\n".join(f"  - {p}" for p in shown)
        if more:
            lines += f"\n  ... and {more} more"
        super().__init__(f"{len(self.problems)} problem(s){where}:\n{lines}")

    def one_line(self) -> str:
        """Every problem on one line, for a message that names the file it came from."""
        return "; ".join(self.problems)


class PlacementError(CodlError):
    """A CPU-set policy cannot be satisfied inside the CPUs the job was given."""


class TraceFormatError(CodlError):
    """A trace file is missing, incomplete, corrupt or of an unsupported schema version."""


class RunInterruptedError(CodlError):
    """A run was stopped by a signal (Slurm timeout, preemption, Ctrl-C) before it finished."""


class DataSetError(CodlError):
    """A sample of the data set cannot be read or decoded; the message names its file."""
