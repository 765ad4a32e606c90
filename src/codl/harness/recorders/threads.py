"""The threads table: every reading of the rank's threads' planned and actual CPU masks
(``threads``), taken by the runner's placement."""

from __future__ import annotations

from typing import Any

from codl.harness.recorders.base import Recorder
from codl.trace.schema import Table
from codl.trace.store import TraceWriter


class ThreadsRecorder(Recorder):
    def drain(self, writer: TraceWriter) -> None:
        if self.ctx.placed.rows:
            writer.append(Table.THREADS, self.columns())

    def columns(self) -> dict[str, list[Any]]:
        stamped = self.ctx.placed.rows
        rows = [r for _, r in stamped]
        return {
            "t_ns": [t for t, _ in stamped],
            "rank": [self.ctx.rank] * len(rows),
            "pid": [r.pid for r in rows],
            "tid": [r.tid for r in rows],
            "role": [str(r.role) for r in rows],
            "name": [r.name for r in rows],
            "cpus_planned": [r.cpus_planned for r in rows],
            "cpus_actual": [r.cpus_actual for r in rows],
        }
