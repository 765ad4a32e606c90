"""The loader level: the workers' timing rows of every batch (``events/loader``)."""

from __future__ import annotations

from codl.harness.recorders.base import Recorder
from codl.trace.schema import Table
from codl.trace.store import TraceWriter


class LoaderRecorder(Recorder):
    """Writes the loader rows the step loop handed over (``RunContext.loader``), a chunk of steps
    at a time."""

    def flush(self, writer: TraceWriter) -> None:
        log = self.ctx.loader
        if log.items:
            writer.append(Table.LOADER, log.columns(self.ctx.rank))
            log.clear()

    def drain(self, writer: TraceWriter) -> None:
        self.flush(writer)
