"""The sched level's phase counters: the launch roles' scheduler counters at the boundaries of
the compute, data-wait and comm spans (``events/phase_sched``; ``codl.trace.sched.PhaseSched``).
The app spans read them (``AppSpans.phase``), inside each span."""

from __future__ import annotations

import os

from codl.harness.recorders.base import Recorder, RunContext
from codl.pinning import Role
from codl.spec import RunSpec
from codl.trace.sched import PhaseSched
from codl.trace.schema import Table
from codl.trace.store import TraceWriter


class PhaseSchedRecorder(Recorder):
    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.counters = PhaseSched(rank=ctx.rank)
        ctx.spans.phase_sched = self.counters

    @classmethod
    def enabled(cls, spec: RunSpec) -> bool:
        return spec.trace.sched

    def threads_placed(self) -> None:
        """Read the autograd threads known so far at phase boundaries, beside the main thread."""
        pid = os.getpid()
        rows = self.ctx.placed.rows
        self.counters.set_threads(
            sorted({r.tid for _, r in rows if r.pid == pid and str(r.role) == Role.AUTOGRAD.value})
        )

    def drain(self, writer: TraceWriter) -> None:
        if self.counters.rows["tid"]:
            writer.append(Table.PHASE_SCHED, self.counters.rows)

    def close(self) -> None:
        self.counters.close()
