"""The sched_events level: every context switch and wake-up of the rank's threads from the
kernel's ftrace buffer (``events/sched_switch``, ``events/sched_waking``;
``codl.trace.ftrace``)."""

from __future__ import annotations

import os
from typing import Any

from codl.errors import CodlError
from codl.harness.recorders.base import Recorder, RunContext
from codl.spec import RunSpec
from codl.trace import ftrace
from codl.trace.store import TraceWriter


class SchedEventsRecorder(Recorder):
    # Before the CUPTI levels start, so the record holds their start-up too.
    starts_first = True

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.recorder: ftrace.SchedEventRecorder | None = None
        self.tables: dict[str, dict[str, Any]] | None = None

    @classmethod
    def enabled(cls, spec: RunSpec) -> bool:
        return spec.trace.sched_events

    def start(self) -> None:
        # Before the first step, after the model, loader workers and communication threads
        # exist: every one of them is followed from the warm-up on.
        recorder = ftrace.SchedEventRecorder(pids=ftrace.tasks_of((os.getpid(),)))
        try:
            recorder.start()
        except ftrace.SchedEventsUnavailableError as exc:
            raise CodlError(f"trace.sched_events: true, but {exc}") from exc
        self.recorder = recorder

    def stop(self, *, complete: bool) -> None:
        """The kernel's record of the run's scheduling, kept for incomplete runs too."""
        if self.recorder is None:
            return
        try:
            self.recorder.stop()
            self.tables, self.ctx.attrs["sched_events"] = self.recorder.collect(rank=self.ctx.rank)
        except Exception as exc:
            self.ctx.attrs["sched_events"] = {"lost": f"{type(exc).__name__}: {exc}"}
        finally:
            self.recorder.close()

    def drain(self, writer: TraceWriter) -> None:
        for name, columns in (self.tables or {}).items():
            if columns["t_ns"]:
                writer.append(name, columns)
