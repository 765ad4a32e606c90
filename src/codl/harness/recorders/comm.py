"""The comm level: every AllReduce the step loop or DDP's hook timed (``events/comm``, and the
GPU side on the host clock, ``events/comm_gpu``; ``codl.harness.comm.CommRecorder``)."""

from __future__ import annotations

from codl.harness.recorders.base import Recorder
from codl.trace.schema import Table
from codl.trace.store import TraceWriter


class CommLevelRecorder(Recorder):
    """Writes the collectives recorded in ``RunContext.comm``; always on (comm mode times its
    collectives whatever the level says, DDP's hook only with it on)."""

    def drain(self, writer: TraceWriter) -> None:
        comm = self.ctx.comm
        if comm.rows["bucket"]:
            writer.append(Table.COMM, comm.rows)
        if comm.gpu_rows["bucket"]:
            writer.append(Table.COMM_GPU, comm.gpu_rows)
