"""Tracer overhead: the same spec untraced and traced, alternating in one process.

Each pair runs the untraced spec and one traced variant back to back (order alternates between
pairs, so drift hits both sides alike); the statistic is the ratio of median step times within a
pair, summarised as the median over pairs with a bootstrap 95 % interval (``codl.measure``: a
paired measurement; the CSV holds every run's median step and every pair's ratio). CUPTI's
cost can linger in the process after it stops, so the CUPTI levels (--cuda-api: callbacks, then
--cupti: Kineto) run after all other variants, every level on, and are divided by the median of
the clean untraced runs measured before any CUPTI; the untraced runs interleaved with them show
whether anything lingers. (benchmarks/launch_api_cost.py compares the CUPTI ways one process per
run.)

    python benchmarks/tracer_overhead.py --device cpu --pairs 10 --csv out.csv
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from codl.datasets import generate
from codl.harness.runner import execute
from codl.measure import Measurement, Recorder, bootstrap_median, table
from codl.spec import RunSpec, TraceSpec
from codl.trace.store import open_trace

OFF = TraceSpec(
    app=True,
    loader=False,
    sched=False,
    cpu=False,
    cuda_events=False,
    comm=False,
    device=False,
    cupti=False,
)
LEVELS: dict[str, dict[str, bool]] = {
    "sched+cpu": {"sched": True, "cpu": True},
    "loader": {"loader": True},
    "cuda_events": {"cuda_events": True},
    "device": {"device": True},
    "all (no cupti)": {
        "sched": True,
        "cpu": True,
        "loader": True,
        "cuda_events": True,
        "comm": True,
        "device": True,
    },
}


def base_spec(args: argparse.Namespace) -> RunSpec:
    gpu = args.device == "cuda"
    return RunSpec.from_dict(
        {
            "mode": args.mode,
            "device": args.device,
            "workload": {
                "model": args.model,
                "batch_size": args.batch_size,
                "image_size": args.image_size,
                "classes": 1000 if gpu else 10,
                "precision": "bf16" if gpu else "fp32",
                "channels_last": gpu,
            },
            "dataset": {
                "samples": args.samples,
                "height": args.height,
                "width": args.width,
                "classes": 10,
            },
            "loader": {"workers": args.workers, "pin_memory": gpu},
            "steps": {"warmup": args.warmup, "measured": args.measured},
        }
    )


def measured_steps(spec: RunSpec, data: Path, out: Path) -> Any:
    """Step spans (start_ns, end_ns) after warm-up of one in-process run; the trace is removed."""
    trace = out / f"{time.monotonic_ns()}.h5"
    execute(
        spec,
        trace_path=trace,
        dataset_dir=data if spec.mode.loads else None,
        kineto_dir=out / "kineto",
    )
    with open_trace(trace) as t:
        app = t.table("events/app")
        warm = int(t.attrs["warmup_steps"])
    trace.unlink()
    return app[(app["phase"].astype(str) == "step") & (app["step"] >= warm)]


def measure(spec: RunSpec, data: Path, out: Path) -> float:
    """Median step time (ms) of one in-process run."""
    st = measured_steps(spec, data, out)
    return float(np.median((st["end_ns"] - st["start_ns"]).to_numpy()) / 1e6)


def add_pair_arguments(p: argparse.ArgumentParser) -> None:
    """Device, data set and step counts of the alternating pairs (shared with harness_overhead)."""
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--height", type=int, default=96)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--measured", type=int, default=12)
    p.add_argument("--pairs", type=int, default=10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_pair_arguments(p)
    p.add_argument("--mode", default="data+compute")
    p.add_argument("--model", default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--levels", default=",".join(LEVELS), help="comma-separated level names")
    p.add_argument("--cupti", action="store_true", help="also measure the Kineto level (CUDA)")
    p.add_argument(
        "--cuda-api", action="store_true", help="also measure the CUPTI callback level (CUDA)"
    )
    p.add_argument("--csv", type=Path, default=Path("benchmarks/results/tracer_overhead.csv"))
    args = p.parse_args(argv)
    gpu = args.device == "cuda"
    args.model = args.model or ("resnet50" if gpu else "resnet_tiny")
    args.batch_size = args.batch_size or (128 if gpu else 16)
    args.image_size = args.image_size or (224 if gpu else 64)
    base = base_spec(args)
    untraced = dataclasses.replace(base, trace=OFF)
    rec = Recorder()
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        data = tmpdir / "data"
        generate(base.dataset, data)
        measure(untraced, data, tmpdir)  # process warm-up: imports, allocator, cuDNN plans
        clean_untraced: list[float] = []
        for level in [lv for lv in args.levels.split(",") if lv]:
            traced = dataclasses.replace(base, trace=dataclasses.replace(OFF, **LEVELS[level]))
            got: dict[str, list[float]] = {"untraced": [], "traced": []}
            rec.mark()
            for i in range(args.pairs):
                order = [(untraced, "untraced"), (traced, "traced")]
                if i % 2:
                    order.reverse()
                for spec, tag in order:
                    got[tag].append(measure(spec, data, tmpdir))
            clean_untraced += got["untraced"]
            u, t = (step_times(rec, got[k], args, level=level, tracing=k) for k in got)
            print_row(level, rec.paired(t, u, "traced / untraced"))
            rec.write(args.csv)  # after every level, so a run cut short keeps what it measured
        ref = (
            statistics.median(clean_untraced) if clean_untraced else measure(untraced, data, tmpdir)
        )
        # CUPTI levels last: their cost may stay in the process after they stop.
        everything = dataclasses.replace(OFF, **LEVELS["all (no cupti)"])
        if args.cuda_api:
            spec = dataclasses.replace(base, trace=dataclasses.replace(everything, cuda_api=True))
            lingering_phase(rec, "all + cuda_api", spec, untraced, ref, args, data, tmpdir)
            rec.write(args.csv)
        if args.cupti:
            spec = dataclasses.replace(
                base,
                trace=dataclasses.replace(everything, cupti=True, cupti_steps=args.measured),
            )
            lingering_phase(rec, "all + cupti", spec, untraced, ref, args, data, tmpdir)
            rec.write(args.csv)
    print()
    print(table(rec.measurements, column="tracing", baseline="untraced"))
    print(f"\nwrote {args.csv}")
    return 0


def step_times(
    rec: Recorder, values: list[float], args: argparse.Namespace, **settings: object
) -> Measurement:
    """One variant's runs: a round is a run, its value the run's median step (ms)."""
    how = "median step"
    return rec.add("step", values, unit="ms", n=args.measured, statistic=how, settings=settings)


def lingering_phase(
    rec: Recorder,
    name: str,
    traced: RunSpec,
    untraced: RunSpec,
    ref: float,
    args: argparse.Namespace,
    data: Path,
    tmpdir: Path,
) -> None:
    """Traced runs and the untraced runs after them, both against the clean untraced median."""
    times: list[float] = []
    after: list[float] = []
    rec.mark()
    for _ in range(args.pairs):
        times.append(measure(traced, data, tmpdir))
        after.append(measure(untraced, data, tmpdir))
    step_times(rec, times, args, level=name, tracing="traced")
    step_times(rec, after, args, level=name, tracing="untraced after")
    how = "run / clean untraced median"
    for label, got in ((f"{name}", times), (f"untraced after {name}", after)):
        m = rec.add(f"{label} vs clean untraced", (x / ref for x in got), unit="x", statistic=how)
        print_row(m.name, m)


def print_row(level: str, m: Measurement) -> None:
    lo, hi = bootstrap_median(m.values)
    print(
        f"{level:<42} n={m.rounds:<3} traced/untraced median step = {m.median:.4f} "
        f"[{lo:.4f}, {hi:.4f}]  ({(m.median - 1) * 100:+.2f} %)",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
