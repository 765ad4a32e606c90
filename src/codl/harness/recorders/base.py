"""What a trace level is to the run: a recorder with hooks at fixed points of the run.

The run (``codl.harness.runner``) calls every hook of every enabled recorder, in registry order
(``codl.harness.recorders.RECORDERS``), at these points:

- construction: after the rank's threads are placed, before the trace file is opened;
- ``start``: after the model, loader workers and communication threads exist, before step -1's
  sample (``starts_first`` recorders first);
- ``step_end``: right after a step's span has closed; ``sample``: after that, and once as step
  -1 before the first step; both outside every measured span;
- ``threads_placed``: after the placement was read back (step 0, last warm-up step);
- ``flush``: every ``DRAIN_EVERY_STEPS`` steps, between steps: bulk rows to the writer;
- ``stop``: after the last step or on the way out of a failed run, signals ignored
  (``stops_last`` recorders last); attributes go into ``RunContext.attrs`` here;
- ``drain``: everything still held, into the writer, after the root attributes are set;
- ``close``: after the trace is written, however the run ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from codl import pinning
from codl.spec import RunSpec
from codl.trace.clock import Anchor
from codl.trace.store import TraceWriter

if TYPE_CHECKING:
    from codl.harness.comm import CommRecorder
    from codl.harness.recorders.loader_log import LoaderLog
    from codl.harness.recorders.spans import AppSpans


class ThreadReadings(Protocol):
    """The rank's readings of its threads' CPU masks (the runner's placement)."""

    @property
    def rows(self) -> list[tuple[int, pinning.ThreadRow]]: ...


@dataclass
class RunContext:
    """What the step loop and the recorders share: the rows the loop writes itself (spans,
    collectives, loader rows), the placement readings and the trace's root attributes."""

    spec: RunSpec
    rank: int
    local_rank: int
    spans: AppSpans
    comm: CommRecorder
    loader: LoaderLog
    placed: ThreadReadings
    kineto_dir: Path | None
    anchor_start: Anchor
    attrs: dict[str, Any] = field(default_factory=dict)


class Recorder:
    """One trace level; every hook does nothing unless the level overrides it."""

    # Started before the others (whatever the registry order), and stopped after the others.
    starts_first: ClassVar[bool] = False
    stops_last: ClassVar[bool] = False

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    @classmethod
    def enabled(cls, spec: RunSpec) -> bool:
        """Whether the run has this level; a level that is not enabled is never constructed."""
        return True

    def start(self) -> None:
        return

    def step_end(self, step: int) -> None:
        return

    def sample(self, step: int) -> None:
        return

    def threads_placed(self) -> None:
        return

    def flush(self, writer: TraceWriter) -> None:
        return

    def stop(self, *, complete: bool) -> None:
        return

    def drain(self, writer: TraceWriter) -> None:
        return

    def close(self) -> None:
        return
