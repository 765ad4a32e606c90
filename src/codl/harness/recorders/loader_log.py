"""The loader's timing rows of every batch (``events/loader``), as the step loop hands them
over. Apart from the recorder that writes them, so that ``RunContext`` can name them without an
import circle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codl.harness import data as hdata
from codl.spec import RunSpec
from codl.trace.schema import LoaderStage, Table, empty_columns

# Loader timing rows addressed by column name; harness.data owns the column order.
_ITEM = {name: i for i, name in enumerate(hdata.ITEM_COLUMNS)}


_COLLATE = {name: i for i, name in enumerate(hdata.COLLATE_COLUMNS)}


# Each per-item stage lies between two of the item row's timestamps.
_ITEM_STAGES = (
    (LoaderStage.FETCH.value, "t0", "t1"),
    (LoaderStage.DECODE.value, "t1", "t2"),
    (LoaderStage.TRANSFORM.value, "t2", "t3"),
)


@dataclass
class LoaderLog:
    """The loader's timing rows of every traced step, as the workers sent them."""

    # With the loader level off no rows are kept (and no worker is seen).
    keep: bool = True
    items: list[np.ndarray] = field(default_factory=list)
    collates: list[np.ndarray] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    # pid -> worker id of the workers of rows already handed to the trace writer.
    seen: dict[int, int] = field(default_factory=dict)
    # Pids of the workers that sent batches since ``take_arrived`` was last called.
    arrived: set[int] = field(default_factory=set)

    @classmethod
    def for_run(cls, spec: RunSpec) -> LoaderLog:
        return cls(keep=spec.trace.loader)

    def add(self, step: int, batch: hdata.Batch) -> None:
        if not self.keep:
            return
        self.items.append(batch.items)
        self.collates.append(batch.collate)
        self.steps.append(step)
        # Batches arrive round-robin from the workers: each new pid is tracked from here on.
        self.arrived |= set(batch.items[:, _ITEM["pid"]].tolist())

    def take_arrived(self) -> set[int]:
        """The pids that sent batches since the last call."""
        arrived, self.arrived = self.arrived, set()
        return arrived

    def workers(self) -> dict[int, int]:
        """pid -> worker id of every loader worker seen."""
        workers: dict[int, int] = dict(self.seen)
        for arr in self.items:
            pids = arr[:, _ITEM["pid"]].tolist()
            for worker, pid in zip(arr[:, _ITEM["worker"]].tolist(), pids, strict=True):
                workers.setdefault(int(pid), int(worker))
        return workers

    def clear(self) -> None:
        """Forget the rows (once written), remembering their workers."""
        self.seen = self.workers()
        self.items.clear()
        self.collates.clear()
        self.steps.clear()

    def columns(self, rank: int) -> dict[str, Any]:
        """Per-item rows expanded into fetch/decode/transform events, plus one collate event
        per batch: the ``events/loader`` columns."""
        cols = empty_columns(Table.LOADER)
        for arr, col, step in zip(self.items, self.collates, self.steps, strict=True):
            n = arr.shape[0]
            item = {name: arr[:, i].tolist() for name, i in _ITEM.items()}
            for stage, start, end in _ITEM_STAGES:
                cols["rank"].extend([rank] * n)
                cols["step"].extend([step] * n)
                for name in ("worker", "pid", "tid", "cpu", "item"):
                    cols[name].extend(item[name])
                cols["stage"].extend([stage] * n)
                cols["start_ns"].extend(item[start])
                cols["end_ns"].extend(item[end])
            cols["rank"].append(rank)
            cols["step"].append(step)
            for name in ("worker", "pid", "tid", "cpu"):
                cols[name].append(int(col[_COLLATE[name]]))
            cols["item"].append(-1)
            cols["stage"].append(LoaderStage.COLLATE.value)
            cols["start_ns"].append(int(col[_COLLATE["t0"]]))
            cols["end_ns"].append(int(col[_COLLATE["t1"]]))
        return cols
