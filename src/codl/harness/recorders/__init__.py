"""Trace levels as recorders: the registry the run iterates, and one rank's set of recorders.

A level is one module here with a ``Recorder`` subclass (``base.py`` says when each hook runs),
listed in ``RECORDERS``; its tables are in ``codl.trace.schema`` and its switch in
``codl.spec.TraceSpec``. The mechanisms themselves stay in ``codl.trace``. ``provenance`` is
no level: it holds the root attributes that say what made the trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from codl.files import signals_deferred
from codl.harness.comm import CommRecorder
from codl.harness.recorders.app import AppRecorder
from codl.harness.recorders.base import Recorder, RunContext, ThreadReadings
from codl.harness.recorders.comm import CommLevelRecorder
from codl.harness.recorders.cuda_api import CudaApiRecorder
from codl.harness.recorders.device import DeviceRecorder
from codl.harness.recorders.kineto import KinetoRecorder
from codl.harness.recorders.loader import LoaderRecorder
from codl.harness.recorders.loader_log import LoaderLog
from codl.harness.recorders.phase_sched import PhaseSchedRecorder
from codl.harness.recorders.sched import SchedRecorder
from codl.harness.recorders.sched_events import SchedEventsRecorder
from codl.harness.recorders.spans import AppSpans
from codl.harness.recorders.threads import ThreadsRecorder
from codl.spec import RunSpec
from codl.trace.clock import Anchor
from codl.trace.store import TraceWriter

# Every level, in the order its tables are written into the trace; every hook runs in this
# order, but for the recorders that start first or stop last (base.Recorder).
RECORDERS: tuple[type[Recorder], ...] = (
    AppRecorder,
    SchedRecorder,
    LoaderRecorder,
    DeviceRecorder,
    CommLevelRecorder,
    PhaseSchedRecorder,
    KinetoRecorder,
    CudaApiRecorder,
    SchedEventsRecorder,
    ThreadsRecorder,
)


@dataclass
class Recorders:
    """One rank's enabled recorders and the trace writer they hand their rows to."""

    ctx: RunContext
    recorders: tuple[Recorder, ...]
    writer: TraceWriter | None = None

    @classmethod
    def create(
        cls,
        spec: RunSpec,
        *,
        rank: int,
        local_rank: int,
        placed: ThreadReadings,
        kineto_dir: Path | None,
        anchor_start: Anchor,
    ) -> Recorders:
        """The rows the step loop writes itself, then every enabled level, in registry order."""
        ctx = RunContext(
            spec=spec,
            rank=rank,
            local_rank=local_rank,
            spans=AppSpans.for_run(spec, rank),
            comm=CommRecorder(rank=rank),
            loader=LoaderLog.for_run(spec),
            placed=placed,
            kineto_dir=kineto_dir,
            anchor_start=anchor_start,
        )
        return cls(ctx, tuple(r(ctx) for r in RECORDERS if r.enabled(spec)))

    def start(self) -> None:
        for r in sorted(self.recorders, key=lambda r: not r.starts_first):
            r.start()

    def step_end(self, step: int) -> None:
        for r in self.recorders:
            r.step_end(step)

    def sample(self, step: int) -> None:
        for r in self.recorders:
            r.sample(step)

    def threads_placed(self) -> None:
        for r in self.recorders:
            r.threads_placed()

    def stop(self, *, complete: bool) -> None:
        """Stop the tracers and put what they collected into the record."""
        for r in sorted(self.recorders, key=lambda r: r.stops_last):
            r.stop(complete=complete)

    def open(self, path: Path) -> TraceWriter:
        """Open the trace writer: from now on ``flush`` streams rows to its partial file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = TraceWriter(path, compression=self.ctx.spec.trace.compression)
        writer.__enter__()
        self.writer = writer
        return writer

    def flush(self) -> None:
        """Hand the bulk rows recorded so far (loader events, thread and core samples) to the
        writer, which writes them a chunk at a time, and forget them: the recorders' memory
        stays bounded by runner.DRAIN_EVERY_STEPS steps of rows whatever the run's length. App
        spans, comm rows and device samples (a few rows per step, some completed later by index)
        stay until ``write``."""
        w = self.writer
        if w is None:
            return
        with signals_deferred():
            for r in self.recorders:
                r.flush(w)

    def write(self, path: Path, *, complete: bool, reason: str) -> None:
        """Write the rest of the trace and finish it; one that did not complete is marked
        incomplete with ``reason``."""
        writer = self.writer or self.open(path)
        self.writer = None
        try:
            writer.set_attrs(**self.ctx.attrs)
            for r in self.recorders:
                r.drain(writer)
            if complete:
                writer.finish()
            else:
                writer.abort(reason or "run did not finish")
        except BaseException as exc:
            writer.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def close(self) -> None:
        for r in self.recorders:
            r.close()


__all__ = ["RECORDERS", "Recorder", "Recorders", "RunContext"]
