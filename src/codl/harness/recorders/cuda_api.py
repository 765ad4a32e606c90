"""The cuda_api level: CUPTI callbacks timing every launch, memcpy/memset and synchronisation
call (``events/cuda``, and with ``cuda_api_sched`` ``events/cuda_sched``;
``codl.trace.cuda_api``)."""

from __future__ import annotations

import contextlib
from typing import Any

from codl.harness.recorders.base import Recorder, RunContext
from codl.spec import RunSpec
from codl.trace import cuda_api
from codl.trace.schema import Table
from codl.trace.store import TraceWriter


class CudaApiRecorder(Recorder):
    # Read back after the scheduler events are collected, as since this level exists.
    stops_last = True

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.tracer: cuda_api.ApiTracer | None = None
        self.rows: dict[str, Any] | None = None
        self.sched_rows: dict[str, Any] | None = None

    @classmethod
    def enabled(cls, spec: RunSpec) -> bool:
        return spec.trace.cuda_api

    def start(self) -> None:
        # From the first warm-up step: the subscription's one-off cost lands in warm-up.
        self.tracer = cuda_api.ApiTracer(sched=self.ctx.spec.trace.cuda_api_sched)
        self.tracer.start()

    def stop(self, *, complete: bool) -> None:
        if self.tracer is None:
            return
        # Cheap and already on our clock: kept for incomplete runs too.
        try:
            tables, attrs = cuda_api.collect_tables(self.tracer, self.ctx.spans)
            self.rows = tables[Table.CUDA]
            self.sched_rows = tables.get(cuda_api.SCHED_TABLE)
            self.ctx.attrs.update(attrs)
        except Exception as exc:
            self.ctx.attrs["cuda_api"] = f"lost: {type(exc).__name__}: {exc}"
        finally:
            with contextlib.suppress(Exception):
                self.tracer.close()

    def drain(self, writer: TraceWriter) -> None:
        if self.rows:
            writer.append(Table.CUDA, self.rows)
        if self.sched_rows and self.sched_rows["tid"]:
            writer.append(Table.CUDA_SCHED, self.sched_rows)
