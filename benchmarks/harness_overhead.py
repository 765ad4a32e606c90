"""Harness overhead: `combined` (here: data+compute on one rank) against a plain training loop.

The plain loop is what a user would write: torchvision ImageFolder-style files decoded with
torchvision.io, the same transforms, a DataLoader with the same workers/prefetch/pinning, the
same model, optimizer, autocast and channels_last, and a device synchronisation per step (the
harness synchronises per step to time it; the plain loop does too, so the comparison measures
the instrumentation, not the synchronisation). The plain loop's sampler is one epoch as long as
the run (a large data set's), since a short epoch drains the prefetch at each end. Runs
alternate in one process; the statistic is the ratio of throughputs within a pair, geometric
mean over pairs with a 95 % t interval on the logs (codl.analysis.runlevel); every pair is
recorded through ``codl.measure`` (the CSV, rewritten after each pair, and the table).

    python benchmarks/harness_overhead.py --device cpu --pairs 10

``--phase-counters`` measures instead what the launch roles' counters at phase boundaries cost
(trace.sched.PhaseSched.read: the main thread's CPU clock and a schedstat pread per launch-role
thread), per read and per step of a loading, training rank (data_wait and compute: 4 reads).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from codl.analysis.runlevel import log_ratio_interval
from codl.datasets import generate
from codl.harness import data as hdata
from codl.harness import workloads
from codl.harness.data import train_transform
from codl.harness.handoff import RingLoader
from codl.measure import Recorder, table
from codl.outputs import output_unit
from codl.spec import Handoff, RunSpec
from tracer_overhead import OFF, add_pair_arguments, base_spec, measured_steps


class PlainFiles(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, root: Path, image_size: int) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [
            (str(f), i) for i, c in enumerate(classes) for f in sorted((root / c).glob("*.jpg"))
        ]
        self.transform = train_transform(image_size)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from torchvision.io import ImageReadMode, decode_jpeg, read_file

        path, label = self.samples[i]
        return self.transform(decode_jpeg(read_file(path), ImageReadMode.RGB)), label


def plain_loop(spec: RunSpec, data: Path, pipeline: str = "plain") -> float:
    """Samples/s over the measured steps of a plain PyTorch training loop; ``pipeline``
    ``harness`` feeds it the harness's data set and collate (per-item timing rows included)
    instead of its own, to tell the input pipeline's share of a difference from the loop's."""
    cuda = spec.device.value == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    model = workloads.get(spec.workload.model).build_model(spec.workload).to(device)
    fmt = torch.channels_last if spec.workload.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=spec.workload.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    files: Any = PlainFiles(data, spec.workload.image_size)
    collate: Any = None
    if pipeline == "harness" or spec.loader.handoff is Handoff.RING:
        # The ring's slots take the harness's samples (input, target, timing row).
        files = hdata.dataset_for("jpeg", data, spec.workload.image_size)
        collate = hdata.collate
    # A user's data set is larger than a run's steps: one epoch spans the run. A shuffled
    # epoch of the (small) benchmark set would end every len/batch steps with the workers'
    # prefetch drained, a stall the harness's endless sampler never has (issue 30 item 7: it
    # made the harness look 1.4x faster). RandomSampler with num_samples beyond the set's size
    # draws permutation after permutation: what a large set's one epoch is.
    loader = torch.utils.data.DataLoader(
        files,
        batch_size=spec.workload.batch_size,
        sampler=torch.utils.data.RandomSampler(
            files, num_samples=spec.steps.total * spec.workload.batch_size
        ),
        num_workers=spec.loader.workers,
        prefetch_factor=spec.loader.prefetch_factor,
        pin_memory=spec.loader.pin_memory and cuda,
        persistent_workers=spec.loader.persistent_workers,
        drop_last=True,
        collate_fn=collate,
    )
    autocast = (
        torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        if spec.workload.precision.value == "bf16"
        else contextlib.nullcontext()
    )

    ring = (
        RingLoader(
            files,
            batch_size=spec.workload.batch_size,
            workers=spec.loader.workers,
            prefetch_factor=spec.loader.prefetch_factor,
            generator=torch.Generator(),
            page_lock=spec.loader.pin_memory and cuda,
            device=device,
        )
        if spec.loader.handoff is Handoff.RING
        else None
    )

    def batches() -> Any:
        if ring is None:
            yield from loader
            return
        try:
            for b in ring:
                yield ring.to_device(b, device)
        finally:
            ring.close()

    it = batches()
    t0 = 0.0
    for step in range(spec.steps.total):
        if step == spec.steps.warmup:
            t0 = time.perf_counter()
        x, y = next(it)[:2]
        x = x.to(device, non_blocking=True).to(memory_format=fmt)
        y = y.to(device, non_blocking=True)
        with autocast:
            loss = loss_fn(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    # Ending the generator shuts the workers down before the next run starts its own.
    it.close()
    return spec.steps.measured * spec.workload.batch_size / elapsed


def harness(spec: RunSpec, data: Path, out: Path) -> float:
    """Samples/s of the harness over its measured steps (first start to last end)."""
    st = measured_steps(spec, data, out)
    elapsed = (st["end_ns"].max() - st["start_ns"].min()) / 1e9
    return spec.steps.measured * spec.workload.batch_size / elapsed


# Reads per step of a rank that loads and trains: data_wait and compute, opened and closed.
PHASE_READS_PER_STEP = 4


def phase_counter_cost(reads: int, csv: Path) -> int:
    """Time PhaseSched.read with the main thread and one helper thread (the autograd thread's
    stand-in, blocked like it is between backward passes): median of 20 batches of ``reads``."""
    import threading

    from codl.trace.sched import PhaseSched

    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    ps = PhaseSched()
    ps.set_threads([helper.native_id or 0])
    # One CPU clock read for the main thread plus one pread per tracked thread.
    syscalls = 1 + len(ps.tids)
    per_read = []
    for _ in range(20):
        t0 = time.perf_counter_ns()
        for _ in range(reads):
            ps.read()
        per_read.append((time.perf_counter_ns() - t0) / reads)
    stop.set()
    ps.close()
    us = statistics.median(per_read) / 1e3
    step_us = us * PHASE_READS_PER_STEP
    print(
        f"phase counters: {us:.2f} us per read ({syscalls} syscalls), "
        f"{PHASE_READS_PER_STEP} reads = {PHASE_READS_PER_STEP * syscalls} syscalls "
        f"= {step_us:.1f} us per step (median of 20 x {reads} reads, p5-p95 "
        f"{np.percentile(per_read, 5) / 1e3:.2f}-{np.percentile(per_read, 95) / 1e3:.2f} us)"
    )
    rec = Recorder()
    rec.add("read", np.asarray(per_read) / 1e3, unit="us", n=reads, statistic="mean read",
            syscalls_per_read=syscalls)  # fmt: skip
    rec.add("per step", np.asarray(per_read) * PHASE_READS_PER_STEP / 1e3, unit="us", n=reads,
            statistic=f"mean read x {PHASE_READS_PER_STEP} reads",
            syscalls_per_read=syscalls)  # fmt: skip
    print(table(rec.measurements))
    rec.write(csv)
    print(f"wrote {csv}")
    return 0


def write_pairs(
    rec: Recorder, csv: Path, h_all: list[float], p_all: list[float], args: Any
) -> tuple[float, float, float]:
    """The pairs so far, recorded (each side's throughput, their paired ratio), with the
    ratios' geometric mean and t interval (NaN under two pairs)."""
    settings = {"device": args.device, "traced": args.traced, "handoff": args.handoff}
    h, p = (
        rec.add("throughput", got, unit="samples/s", n=args.measured, statistic="run",
                loop=loop, **settings)
        for loop, got in (("harness", h_all), ("plain", p_all))
    )  # fmt: skip
    ratio = rec.paired(h, p, "harness / plain")
    iv = log_ratio_interval(list(ratio.values))
    with output_unit([csv], mkdir=True) as unit:
        rec.write(unit.path(csv))
    return iv.ratio, iv.lo, iv.hi


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_pair_arguments(p)
    p.add_argument("--traced", action="store_true", help="harness with every non-CUPTI level on")
    p.add_argument("--csv", type=Path, default=Path("benchmarks/results/harness_overhead.csv"))
    p.add_argument(
        "--phase-counters",
        type=int,
        metavar="READS",
        default=0,
        help="only time the phase-boundary counters (READS reads per batch) and exit",
    )
    p.add_argument(
        "--no-pin",
        action="store_true",
        help="pageable batches (no pin-memory thread, whose GIL holds slow a GIL-bound loop)",
    )
    p.add_argument(
        "--handoff",
        choices=[h.value for h in Handoff],
        default=Handoff.TORCH.value,
        help="the loader hand-off of both loops (ring: the harness's data set on both sides)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=float("inf"),
        help="start no pair after S seconds (the CSV is rewritten after every pair, so a call "
        "cut at a device's limit keeps the pairs it measured)",
    )
    p.add_argument(
        "--plain-pipeline",
        choices=["plain", "harness"],
        default="plain",
        help="the plain loop's data set and collate: its own, or the harness's",
    )
    args = p.parse_args(argv)
    if args.phase_counters:
        return phase_counter_cost(args.phase_counters, args.csv.with_name("phase_counter_cost.csv"))
    gpu = args.device == "cuda"
    args.mode = "data+compute"
    args.model = "resnet50" if gpu else "resnet_tiny"
    args.batch_size = 128 if gpu else 16
    args.image_size = 224 if gpu else 64
    spec = base_spec(args)
    if not args.traced:
        spec = dataclasses.replace(spec, trace=OFF)
    if args.handoff == Handoff.RING.value:
        spec = dataclasses.replace(
            spec, loader=dataclasses.replace(spec.loader, handoff=Handoff.RING)
        )
    if args.no_pin:
        spec = dataclasses.replace(spec, loader=dataclasses.replace(spec.loader, pin_memory=False))
    rec = Recorder()
    ratios: list[float] = []
    h_all: list[float] = []
    p_all: list[float] = []
    deadline = time.monotonic() + args.seconds
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        data = out / "data"
        generate(spec.dataset, data)
        plain_loop(spec, data, args.plain_pipeline)  # process warm-up
        for i in range(args.pairs):
            if time.monotonic() > deadline:
                print(f"--seconds {args.seconds:g} reached: {i} of {args.pairs} pairs")
                break
            if i % 2:
                p_s = plain_loop(spec, data, args.plain_pipeline)
                h_s = harness(spec, data, out)
            else:
                h_s = harness(spec, data, out)
                p_s = plain_loop(spec, data, args.plain_pipeline)
            h_all.append(h_s)
            p_all.append(p_s)
            ratios.append(h_s / p_s)
            print(f"pair {i}: harness {h_s:.1f} samples/s, plain {p_s:.1f} -> {h_s / p_s:.4f}")
            med, lo, hi = write_pairs(rec, args.csv, h_all, p_all, args)
    if not ratios:
        print("no pair measured", file=sys.stderr)
        return 1
    print(
        f"\nharness/plain throughput: {med:.4f} [{lo:.4f}, {hi:.4f}] (geometric mean, 95 % t "
        f"interval on logs) over {len(ratios)} "
        f"pairs (harness {statistics.median(h_all):.1f}, plain {statistics.median(p_all):.1f} "
        "samples/s)"
    )
    print(table(rec.measurements, column="loop", baseline="plain"))
    print(f"wrote {args.csv}")
    return 0 if np.isfinite(med) else 1


if __name__ == "__main__":
    sys.exit(main())
