"""The app level: the step loop's own spans (``events/app``), host clock and CUDA events."""

from __future__ import annotations

import contextlib

from codl.harness.recorders.base import Recorder
from codl.trace.schema import Table
from codl.trace.store import TraceWriter


class AppRecorder(Recorder):
    """Writes the spans the step loop recorded (``RunContext.spans``); always on."""

    def stop(self, *, complete: bool) -> None:
        # A failed run's spans still get the GPU times of the steps it finished.
        with contextlib.suppress(Exception):
            self.ctx.spans.resolve_gpu()

    def drain(self, writer: TraceWriter) -> None:
        # The step spans first: every later statistic needs them.
        writer.append(Table.APP, self.ctx.spans.rows)
