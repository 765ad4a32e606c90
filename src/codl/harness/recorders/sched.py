"""The sched and cpu levels: every thread's scheduler counters and every core's time, sampled at
step boundaries (``samples/sched``, ``samples/cpu``; ``codl.trace.sched.SchedSampler``)."""

from __future__ import annotations

import os

from codl.harness.recorders.base import Recorder, RunContext
from codl.spec import RunSpec
from codl.trace.sched import SchedSampler
from codl.trace.schema import Table
from codl.trace.store import TraceWriter


class SchedRecorder(Recorder):
    """This process's threads and, once their batches arrive, the loader workers' threads."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        trace = ctx.spec.trace
        self.sampler = SchedSampler(rank=ctx.rank, per_thread=trace.sched, per_core=trace.cpu)
        self.sampler.track(os.getpid())

    @classmethod
    def enabled(cls, spec: RunSpec) -> bool:
        return spec.trace.sched or spec.trace.cpu

    def sample(self, step: int) -> None:
        # The workers are known from the loader rows (loader level on); a worker that sent this
        # step's batch is sampled from this step's sample on.
        for pid in self.ctx.loader.take_arrived():
            self.sampler.track(pid)
        self.sampler.sample(step)

    def flush(self, writer: TraceWriter) -> None:
        s = self.sampler
        for table, rows in ((Table.SCHED, s.rows), (Table.CPU, s.cpu_rows)):
            if rows["t_ns"]:
                writer.append(table, rows)
                for values in rows.values():
                    values.clear()

    def drain(self, writer: TraceWriter) -> None:
        self.flush(writer)

    def close(self) -> None:
        self.sampler.close()
