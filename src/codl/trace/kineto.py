"""CUPTI level through Kineto (torch.profiler), converted onto the run's monotonic clock.

CUPTI perturbs what it measures (on an H200, ResNet-50 ran 1.33x slower with Kineto on every
step, and the slowdown lingers after the profiler stops), so this level is explicit, one window
of ``trace.cupti_steps`` measured steps right after warm-up, and never on by default. The raw
Chrome trace Kineto writes is kept next to the HDF5 trace so HTA and Perfetto can read it.

Kineto timestamps are Unix time: ``baseTimeNanoseconds + ts * 1000`` (``ts`` in microseconds).
They are moved to CLOCK_MONOTONIC with the run's start anchor. The residual alignment error is
measured on the profiler's own ``ProfilerStep#N`` annotations, whose ends are issued right after
our step spans end: the median offset between the two is stored as ``cupti_alignment_ns``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from codl.spec import RunSpec
from codl.trace.clock import Anchor
from codl.trace.schema import Table, empty_columns

RUNTIME_KINDS = {
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_sync": "sync",
}


class Spans(Protocol):
    rows: dict[str, list[Any]]  # events/app columns


class StepIndex:
    """The run's step spans, to place an event that starts at time t into its step."""

    def __init__(self, spans: Spans) -> None:
        rows = spans.rows
        pick = [i for i, ph in enumerate(rows["phase"]) if ph == "step"]
        self.starts = np.array([rows["start_ns"][i] for i in pick], dtype=np.int64)
        self.ends = np.array([rows["end_ns"][i] for i in pick], dtype=np.int64)
        self.steps = np.array([rows["step"][i] for i in pick], dtype=np.int64)
        self.rank = int(rows["rank"][0]) if rows["rank"] else 0

    def step_of(self, t_ns: int) -> int:
        """The step whose span contains t_ns, or -1 (between steps, before or after the loop)."""
        return int(self.steps_of(np.array([t_ns], dtype=np.int64))[0])

    def steps_of(self, t_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        out = np.full(t_ns.shape, -1, dtype=np.int64)
        if not self.starts.size:
            return out
        i = np.searchsorted(self.starts, t_ns, side="right") - 1
        j = np.clip(i, 0, None)
        inside = (i >= 0) & (t_ns <= self.ends[j])
        out[inside] = self.steps[j[inside]]
        return out

    def end_of(self, step: int) -> int | None:
        hit = np.nonzero(self.steps == step)[0]
        return int(self.ends[hit[0]]) if hit.size else None


def start_window(spec: RunSpec, out_dir: Path | None) -> Any:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    warm = 1 if spec.steps.warmup >= 1 else 0
    prof = profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(
            wait=spec.steps.warmup - warm, warmup=warm, active=spec.trace.cupti_steps, repeat=1
        ),
        record_shapes=False,
        with_stack=False,
    )
    prof.start()
    _ = torch  # the profiler owns CUPTI from here on
    return prof


def collect(
    prof: Any, out_dir: Path | None, spans: Spans, anchor: Anchor
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Export the window's Chrome trace, keep it gzipped, and convert it to events/cuda rows."""
    if out_dir is None:
        return None, {"cupti": "no kineto_dir given; CUPTI events dropped"}
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / f"rank{spans.rows['rank'][0] if spans.rows['rank'] else 0}.pt.trace.json"
    try:
        prof.export_chrome_trace(str(raw))
    except RuntimeError as exc:
        return None, {"cupti": f"Kineto export failed: {exc}"}
    doc = json.loads(raw.read_text())
    with gzip.open(raw.with_suffix(".json.gz"), "wt") as f:
        json.dump(doc, f)
    raw.unlink()
    rows, attrs = convert(doc, spans, anchor)
    attrs["cupti_raw"] = raw.with_suffix(".json.gz").name
    return rows, attrs


def convert(
    doc: dict[str, Any], spans: Spans, anchor: Anchor
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Chrome trace dict -> events/cuda columns on the monotonic clock, plus alignment stats."""
    base = int(doc.get("baseTimeNanoseconds", 0))

    def mono(ts_us: float) -> int:
        return anchor.to_monotonic(base + round(float(ts_us) * 1000))

    index = StepIndex(spans)
    rank = index.rank

    cols = empty_columns(Table.CUDA)
    offsets: list[int] = []
    for ev in doc.get("traceEvents", []):
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat", "")
        name = str(ev.get("name", ""))
        if cat == "user_annotation" and name.startswith("ProfilerStep#"):
            step_end = index.end_of(int(name.split("#", 1)[1]))
            if step_end is not None:
                offsets.append(mono(ev["ts"] + ev.get("dur", 0)) - step_end)
            continue
        kind = RUNTIME_KINDS.get(cat)
        if kind is None:
            continue
        if kind == "runtime" and "Synchronize" in name:
            kind = "sync"
        start = mono(ev["ts"])
        end = mono(ev["ts"] + ev.get("dur", 0))
        args = ev.get("args", {})
        gpu_side = kind in {"kernel", "memcpy", "memset"}
        cols["rank"].append(rank)
        cols["step"].append(index.step_of(start))
        cols["kind"].append(kind)
        cols["name"].append(name)
        cols["tid"].append(0 if gpu_side else int(ev.get("tid", 0)))
        cols["stream"].append(int(args.get("stream", -1)) if gpu_side else -1)
        cols["correlation"].append(int(args.get("correlation", -1)))
        cols["start_ns"].append(start)
        cols["end_ns"].append(end)
    attrs: dict[str, Any] = {
        "cupti": "on",
        "cupti_events": len(cols["step"]),
        "cupti_alignment_ns": int(np.median(offsets)) if offsets else -1,
        "cupti_alignment_samples": len(offsets),
    }
    return cols, attrs
