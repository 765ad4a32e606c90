"""The cupti level: Kineto's window of measured steps (``events/cuda``; ``codl.trace.kineto``)."""

from __future__ import annotations

import contextlib
from typing import Any

from codl.harness.recorders.base import Recorder, RunContext
from codl.spec import RunSpec
from codl.trace import kineto
from codl.trace.schema import Table
from codl.trace.store import TraceWriter


class KinetoRecorder(Recorder):
    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.profiler: Any = None
        self.rows: dict[str, Any] | None = None

    @classmethod
    def enabled(cls, spec: RunSpec) -> bool:
        return spec.trace.cupti

    def start(self) -> None:
        self.profiler = kineto.start_window(self.ctx.spec, self.ctx.kineto_dir)

    def step_end(self, step: int) -> None:
        # The profiler's schedule counts steps: its window opens and closes here, before the
        # step's OS samples.
        if self.profiler is not None:
            self.profiler.step()

    def stop(self, *, complete: bool) -> None:
        if self.profiler is None:
            return
        with contextlib.suppress(Exception):
            self.profiler.stop()
        if complete:
            ctx = self.ctx
            self.rows, attrs = kineto.collect(
                self.profiler, ctx.kineto_dir, ctx.spans, ctx.anchor_start
            )
            ctx.attrs.update(attrs)

    def drain(self, writer: TraceWriter) -> None:
        if self.rows:
            writer.append(Table.CUDA, self.rows)
