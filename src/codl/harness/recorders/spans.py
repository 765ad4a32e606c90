"""The step loop's own spans (``events/app``): host clock and CUDA events, the rows the app
level writes. Apart from the recorder that writes them, so that ``RunContext`` can name them
without an import circle."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from codl.harness.comm import cuda_event_pair
from codl.spec import DeviceKind, RunSpec
from codl.trace.clock import now_ns
from codl.trace.sched import PhaseSched
from codl.trace.schema import SAMPLED_PHASES, Phase, Table, empty_columns


@dataclass
class AppSpans:
    """Application spans in column lists plus the CUDA event pairs still to be resolved."""

    rank: int
    # With the app level off only the step spans are kept: the step loop and every later
    # statistic need them, the per-phase breakdown is what the level adds.
    app: bool = True
    cuda_events: bool = False
    tid: int = field(default_factory=threading.get_native_id)
    rows: dict[str, list[Any]] = field(default_factory=lambda: empty_columns(Table.APP))
    pending: list[tuple[int, Any, Any]] = field(default_factory=list)
    # Launch-role counters at the boundaries of the SAMPLED_PHASES spans (None: level off).
    phase_sched: PhaseSched | None = None

    @classmethod
    def for_run(cls, spec: RunSpec, rank: int) -> AppSpans:
        cuda = spec.device is DeviceKind.CUDA
        return cls(rank=rank, app=spec.trace.app, cuda_events=cuda and spec.trace.cuda_events)

    def span(self, step: int, phase: str, start: int, end: int, events: Any = None) -> None:
        if not self.app and phase != Phase.STEP.value:
            return
        r = self.rows
        r["rank"].append(self.rank)
        r["step"].append(step)
        r["phase"].append(phase)
        r["tid"].append(self.tid)
        r["start_ns"].append(start)
        r["end_ns"].append(end)
        r["gpu_ns"].append(-1)
        if events is not None:
            self.pending.append((len(r["step"]) - 1, events[0], events[1]))

    def resolve_gpu(self) -> None:
        # elapsed_time is ms as float with ~0.5 us resolution; events are complete because every
        # step ended with a synchronisation.
        for idx, start, end in self.pending:
            self.rows["gpu_ns"][idx] = round(start.elapsed_time(end) * 1e6)
        self.pending.clear()

    def events(self) -> tuple[Any, Any] | None:
        return cuda_event_pair(self.cuda_events)

    @contextlib.contextmanager
    def phase(self, step: int, name: str, *, gpu: bool = True) -> Iterator[list[int]]:
        """Time the block as span ``name`` of ``step`` (host clock, and CUDA events if ``gpu``).

        Yields a list that holds ``[start_ns, end_ns]`` once the block has ended.
        """
        ev = self.events() if gpu else None
        ps = self.phase_sched if name in SAMPLED_PHASES else None
        times = [now_ns()]
        # Counters are read inside the span, so they never cover time outside it (a preemption
        # between a read and the stamp would); their few microseconds land in every run alike.
        before = ps.read() if ps is not None else None
        if ev:
            ev[0].record()
        yield times
        if ev:
            ev[1].record()
        after = ps.read() if ps is not None else None
        times.append(now_ns())
        self.span(step, name, times[0], times[1], ev)
        if ps is not None and before is not None and after is not None:
            ps.record(step, name, (times[0], times[1]), before, after)
