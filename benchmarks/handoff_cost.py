"""The loader hand-off alone: torch's DataLoader against the ring (``loader.handoff``), side by
side in one process, as the harness builds them (its data set, transforms, sampler, seeds).

Per leg: ``--batches`` batches taken after ``--warmup``, each copied to the device and
synchronised, then a burst of ``--launches`` tiny kernels launched and timed on the CPU (what a
training step's launch thread does). Reported per batch:

- ``batches_s``: batches delivered per second;
- ``rank_cpu_ms``: CPU time of the rank's process, all its threads (the pin-memory thread of
  torch's loader included; the workers are other processes), from ``time.process_time``;
- ``gil_held_ms``: how long a probe thread that asks for the GIL every millisecond waits for it
  beyond its own sleep, over what the probe waits with no loader at all (measured first, in the
  same process): the time the rank's other threads held the GIL while a thread wanted it, which
  is what a launch thread waits. It is a probe, not a count of every hold: holds between two of
  its requests are not seen;
- ``launch_ms``: the CPU time to launch the burst (CUDA only).

Legs alternate (ABBA over ``--pairs``); ratios ring/torch are per pair, with a t interval on
their logs (codl.analysis.runlevel). Every leg is recorded through ``codl.measure``: prints its
table and writes ``--out`` (its CSV: one row per metric and hand-off, every pair's value in it).

    python benchmarks/handoff_cost.py --device cuda --workers 12 --data DIR --out results/...
    python benchmarks/handoff_cost.py --device cpu --workers 2 --batch-size 16 --image-size 64
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from codl import pinning
from codl.analysis.runlevel import log_ratio_interval
from codl.datasets import generate
from codl.harness import data as hdata
from codl.harness.handoff import RingLoader
from codl.harness.runner import _seed_worker
from codl.measure import Recorder, table
from codl.spec import DatasetSpec, PinningSpec

HANDOFFS = ("torch", "ring")
METRICS = ("batches_s", "rank_cpu_ms", "gil_held_ms", "launch_ms")


class GilProbe:
    """A thread that sleeps ``interval`` and records how late it got the GIL back."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.lateness: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gil-probe", daemon=True)

    def _run(self) -> None:
        clock, sleep, interval = time.perf_counter, time.sleep, self.interval
        out = self.lateness
        while not self._stop.is_set():
            t = clock()
            sleep(interval)
            out.append(clock() - t - interval)

    def __enter__(self) -> GilProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _loader(
    handoff: str, data: Path, args: argparse.Namespace, device: torch.device
) -> Iterator[Any]:
    dataset = hdata.dataset_for("jpeg", data, args.image_size)
    placement = pinning.plan(PinningSpec(), allowed=os.sched_getaffinity(0), workers=args.workers)
    init_fn = functools.partial(_seed_worker, placement, 0, 0)  # seed 0, no nice: as before
    gen = torch.Generator().manual_seed(0)
    pin = device.type == "cuda"
    if handoff == "ring":
        return iter(
            RingLoader(
                dataset,
                batch_size=args.batch_size,
                workers=args.workers,
                prefetch_factor=args.prefetch,
                generator=gen,
                worker_init_fn=init_fn,
                page_lock=pin,
                device=device,
            )
        )
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=hdata.EndlessShuffle(len(dataset), gen),
        multiprocessing_context=hdata.worker_context(),
        num_workers=args.workers,
        prefetch_factor=args.prefetch,
        pin_memory=pin,
        drop_last=True,
        collate_fn=hdata.collate,
        worker_init_fn=init_fn,
    )
    return iter(loader)


def _close(it: Any) -> None:
    if isinstance(it, RingLoader):
        it.close()
    else:
        it._shutdown_workers()


def _to_device(it: Any, batch: hdata.Batch, device: torch.device) -> torch.Tensor:
    if isinstance(it, RingLoader):
        return it.to_device(batch, device)[0]
    return batch.inputs.to(device, non_blocking=True)


def leg(handoff: str, data: Path, args: argparse.Namespace, baseline: float) -> dict[str, Any]:
    device = torch.device(args.device)
    small = torch.zeros(16, device=device)
    it = _loader(handoff, data, args, device)
    try:
        for _ in range(args.warmup):
            _to_device(it, next(it), device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        launch_s = 0.0
        with GilProbe() as probe:
            cpu0, t0 = time.process_time(), time.perf_counter()
            for _ in range(args.batches):
                x = _to_device(it, next(it), device)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                    t = time.perf_counter()
                    for _ in range(args.launches):
                        small.add_(1)
                    launch_s += time.perf_counter() - t
                del x
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
        late = probe.lateness
    finally:
        _close(it)
    n = args.batches
    return {
        "handoff": handoff,
        "batches": n,
        "batches_s": n / wall,
        "rank_cpu_ms": 1e3 * cpu / n,
        "gil_held_ms": 1e3 * max(0.0, sum(late) - baseline * len(late)) / n,
        "launch_ms": 1e3 * launch_s / n if device.type == "cuda" else float("nan"),
        "probe_wakes": len(late),
    }


def probe_baseline(seconds: float = 2.0) -> float:
    """The probe's median lateness with nothing else in the process: timer slack and wake-up."""
    with GilProbe() as probe:
        time.sleep(seconds)
    return statistics.median(probe.lateness)


# Each metric's unit and what a leg's value is over its batches.
UNITS = {
    "batches_s": ("batches/s", "leg"),
    "rank_cpu_ms": ("ms", "mean batch"),
    "gil_held_ms": ("ms", "mean batch"),
    "launch_ms": ("ms", "mean batch"),
}


def record(rec: Recorder, legs: list[dict[str, Any]], batches: int) -> list[str]:
    """Each metric's legs per hand-off (a round is a pair's leg) and their paired ratio
    ring/torch; returns the ratios' geometric means with their t interval, one line each."""
    lines = []
    for metric in METRICS:
        got = {
            h: [r[metric] for r in sorted(legs, key=lambda r: r["pair"]) if r["handoff"] == h]
            for h in HANDOFFS
        }
        if any(math.isnan(v) for v in got["torch"] + got["ring"]):  # not measured on this device
            continue
        unit, how = UNITS[metric]
        a, b = (rec.add(metric, got[h], unit=unit, n=batches, statistic=how, handoff=h)
                for h in HANDOFFS)  # fmt: skip
        if all(x > 0 for x in a.values + b.values):
            ratio = rec.paired(b, a, f"{metric} ring / torch")
            iv = log_ratio_interval(list(ratio.values)) if ratio.rounds >= 2 else None
            if iv is not None:
                lines.append(f"{metric:12s} ring/torch {iv.ratio:.3f} [{iv.lo:.3f}, {iv.hi:.3f}]")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--launches", type=int, default=300)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--data", type=Path, help="a JPEG data set (codl dataset); made if absent")
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--out", type=Path, default=Path("handoff_cost.csv"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None or not data.exists():
            data = data or Path(tmp) / "jpeg"
            generate(DatasetSpec(samples=args.samples, height=375, width=500, classes=100), data)
        baseline = probe_baseline()
        rows = []
        for pair in range(args.pairs):
            order = HANDOFFS if pair % 2 == 0 else HANDOFFS[::-1]
            for handoff in order:
                row = leg(handoff, data, args, baseline)
                rows.append({"pair": pair, **row, "probe_baseline_ms": 1e3 * baseline})
                print(
                    f"pair {pair} {handoff:5s} " + " ".join(f"{m}={row[m]:.3f}" for m in METRICS),
                    flush=True,
                )
    rec = Recorder()
    rec.add("probe baseline", [1e3 * baseline], unit="ms", statistic="median lateness, idle")
    lines = record(rec, rows, args.batches)
    print(
        f"\n{args.device}, {args.workers} workers, batch {args.batch_size}, "
        f"{args.image_size}px, {args.batches} batches x {args.pairs} pairs"
    )
    print(table(rec.measurements, column="handoff", baseline="torch"))
    print("geometric mean of the pairs' ratios, 95 % t interval on the logs:")
    print("\n".join(lines))
    rec.write(args.out)


if __name__ == "__main__":
    main()
