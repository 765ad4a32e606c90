"""The cheapest way to get per-call CUDA runtime API latency: cost of each way, side by side.

Variants, each a fresh process running the same compute-only training steps (synthetic batch on
the GPU, no loader: the question is the cost on the launch path):

  plain        no CUPTI at all;
  callbacks-idle  the same subscription with recording off: the callback returns at once, so
               what is left is CUPTI's own cost of dispatching it;
  callbacks    codl's `cuda_api` level: CUPTI callback API on launch/memcpy/memset/sync only,
               a C callback stamping entry and exit (src/codl/trace/cuda_api_shim.c);
  callbacks-sched  the same with `trace.cuda_api_sched`: each call's context-switch counts
               read at entry and exit (getrusage), the thread CPU clock only after a switch;
  kineto-cuda  torch.profiler with ProfilerActivity.CUDA only (CUPTI activity API: runtime
               calls and kernels, no PyTorch operator recording);
  kineto       torch.profiler with CPU and CUDA activities (what the `cupti` level uses).

Every traced variant is on from the first warm-up step to the last measured step. CUPTI's
cost lingers inside a process, hence one process per run; the order of variants rotates from
round to round. Per round, each variant's median step time is divided by the plain run's of
the same round; the table gives the median of those ratios over rounds with a bootstrap 95 %
interval, plus the cudaLaunchKernel latency each tracing variant reports. Every round is
recorded through ``codl.measure`` (the CSV, rewritten after each round; ``--pool`` reads it,
and the per-round CSVs written before it).

    python benchmarks/launch_api_cost.py --rounds 5 --csv benchmarks/results/launch_api_cost.csv

``--ranks 2`` runs each variant as a 2-rank DDP step (NCCL, one GPU and half of the CPUs per
rank): the callback level's cost where every launch thread also drives an AllReduce.

``--shim-cost`` needs no GPU: it calls the compiled shim's callback from a C loop, entry and
exit as CUPTI would, and prints the CPU-side cost per call of each shim setting (recording off,
on, on with scheduling evidence). That is the shim's own cost only, not CUPTI's dispatch nor
anything the GPU run sees.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from codl.measure import PAIRED, Measurement, Recorder, bootstrap_median, read_csv
from codl.measure import table as render

VARIANTS = ("plain", "callbacks-idle", "callbacks", "callbacks-sched", "kineto-cuda", "kineto")
# The shim settings --shim-cost times: (label, armed, sched evidence).
SHIM_SETTINGS = (("idle", 0, 0), ("callbacks", 1, 0), ("callbacks-sched", 1, 1))
# A C driver for --shim-cost: ctypes would cost more per call than the shim itself.
SHIM_DRIVER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef struct {
    int32_t callback_site;
    const char *function_name;
    const void *function_params;
    void *function_return_value;
    const char *symbol_name;
    void *context;
    uint32_t context_uid;
    uint64_t *correlation_data;
    uint32_t correlation_id;
} cbdata;
static int64_t now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (h == NULL) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    long n = atol(argv[2]);
    int armed = atoi(argv[3]), sched = atoi(argv[4]);
    int (*init)(uint64_t) = (int (*)(uint64_t))dlsym(h, "codl_init");
    void (*arm)(int) = (void (*)(int))dlsym(h, "codl_arm");
    void (*set_sched)(int) = (void (*)(int))dlsym(h, "codl_set_sched");
    void (*cb)(void *, int32_t, uint32_t, const void *) =
        (void (*)(void *, int32_t, uint32_t, const void *))dlsym(h, "codl_cupti_callback");
    if (init((uint64_t)n) != 0) return 1;
    set_sched(sched);
    arm(armed);
    uint64_t slot = 0;
    cbdata d = {0};
    d.correlation_data = &slot;
    int64_t t0 = now();
    for (long i = 0; i < n; i++) {
        d.correlation_id = (uint32_t)i;
        d.callback_site = 0;
        cb(NULL, 2, 211, &d);
        d.callback_site = 1;
        cb(NULL, 2, 211, &d);
    }
    printf("%.1f\n", (double)(now() - t0) / (double)n);
    return 0;
}
"""


class _StepSpans:
    """The events/app step columns that the CUPTI converters place calls into steps with."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        n = len(spans)
        self.rows: dict[str, list[Any]] = {
            "rank": [0] * n,
            "step": list(range(n)),
            "phase": ["step"] * n,
            "start_ns": [s for s, _ in spans],
            "end_ns": [e for _, e in spans],
        }


def api_stats(rows: dict[str, Any] | None, first: int, last: int) -> tuple[list[float], int]:
    """cudaLaunchKernel durations (us) and the number of API calls starting in [first, last]."""
    if rows is None:
        return [], 0
    start = np.asarray(rows["start_ns"], dtype=np.int64)
    dur_us = (np.asarray(rows["end_ns"], dtype=np.int64) - start) / 1e3
    kind = np.asarray(rows["kind"], dtype=str)
    api = np.isin(kind, ["runtime", "sync"]) & (start >= first) & (start <= last)
    is_launch = api & (np.char.find(np.asarray(rows["name"], dtype=str), "LaunchKernel") >= 0)
    return dur_us[is_launch].tolist(), int(api.sum())


def child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """One variant's run: in this process, or with --ranks N > 1 as N DDP ranks (NCCL, one GPU
    and an equal share of this process's CPUs each, as the harness places them); rank 0's
    numbers are returned, the slowest rank's median step beside them."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("launch_api_cost.py needs a CUDA GPU (CUPTI)")
    if args.ranks <= 1:
        return _train(variant, args, 0)
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank_main, args=(variant, args, port, tmp), nprocs=args.ranks, join=True)
        results = [json.loads((Path(tmp) / f"{r}.json").read_text()) for r in range(args.ranks)]
    out = dict(results[0])
    out["step_ms_median_slowest_rank"] = max(r["step_ms_median"] for r in results)
    return out


def _rank_main(rank: int, variant: str, args: argparse.Namespace, port: int, tmp: str) -> None:
    import torch
    import torch.distributed as dist

    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // args.ranks
    os.sched_setaffinity(0, cpus[rank * share : (rank + 1) * share])
    torch.cuda.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=args.ranks)
    try:
        res = _train(variant, args, rank)
    finally:
        dist.destroy_process_group()
    (Path(tmp) / f"{rank}.json").write_text(json.dumps(res))


def _train(variant: str, args: argparse.Namespace, rank: int) -> dict[str, Any]:
    import torch

    from codl.harness import workloads
    from codl.spec import Precision, WorkloadSpec
    from codl.trace import cuda_api, kineto
    from codl.trace.clock import take_anchor

    dev = torch.device("cuda", rank)
    wl = WorkloadSpec(
        model=args.model,
        batch_size=args.batch_size,
        image_size=args.image_size,
        classes=1000,
        precision=Precision.BF16,
        channels_last=True,
    )
    model = workloads.get(wl.model).build_model(wl).to(dev, memory_format=torch.channels_last)
    if args.ranks > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(wl.batch_size, 3, wl.image_size, wl.image_size, device=dev)
    x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, wl.classes, (wl.batch_size,), device=dev)
    torch.cuda.synchronize()

    tracer = None
    prof = None
    anchor = take_anchor()
    if variant.startswith("callbacks"):
        tracer = cuda_api.ApiTracer(sched=variant == "callbacks-sched")
        tracer.start(arm=variant != "callbacks-idle")
    elif variant.startswith("kineto"):
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CUDA]
        if variant == "kineto":
            acts.insert(0, ProfilerActivity.CPU)
        prof = profile(activities=acts, record_shapes=False, with_stack=False)
        prof.start()
    spans: list[tuple[int, int]] = []
    for _ in range(args.warmup + args.measured):
        t0 = time.monotonic_ns()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        spans.append((t0, time.monotonic_ns()))
    measured = spans[args.warmup :]
    first, last = measured[0][0], measured[-1][1]
    # Both levels' own converters place the calls on the run's clock.
    steps = _StepSpans(spans)
    rows: dict[str, Any] | None = None
    evidence: dict[str, Any] | None = None
    if tracer is not None:
        tables, _ = cuda_api.collect_tables(tracer, steps)
        rows, evidence = tables["events/cuda"], tables.get(cuda_api.SCHED_TABLE)
        tracer.close()
    if prof is not None:
        prof.stop()
        with tempfile.TemporaryDirectory() as tmp:
            rows, _ = kineto.collect(prof, Path(tmp), steps, anchor)
    launch, api_calls = api_stats(rows, first, last)
    step_ms = [(e - s) / 1e6 for s, e in measured]
    return {
        "variant": variant,
        "step_ms_median": statistics.median(step_ms),
        "launch_calls_per_step": len(launch) / len(measured),
        "api_calls_per_step": api_calls / len(measured),
        "launch_us_p50": float(np.median(launch)) if launch else float("nan"),
        "launch_us_mean": float(np.mean(launch)) if launch else float("nan"),
        **evidence_stats(rows, evidence, first, last),
    }


def evidence_stats(
    rows: dict[str, Any] | None, evidence: dict[str, Any] | None, first: int, last: int
) -> dict[str, float]:
    """What the scheduling evidence says about the measured calls: the share that left the CPU
    (any context switch) and the calls' total off-CPU time per call (NaN without evidence)."""
    if rows is None or evidence is None or not evidence["start_ns"]:
        return {"switched_pct": float("nan"), "off_cpu_us_mean": float("nan")}
    start = np.asarray(evidence["start_ns"], dtype=np.int64)
    dur = np.asarray(evidence["end_ns"], dtype=np.int64) - start
    cpu = np.asarray(evidence["thread_cpu_ns"], dtype=np.int64)
    switches = np.asarray(evidence["voluntary"], dtype=np.int64) + np.asarray(
        evidence["involuntary"], dtype=np.int64
    )
    keep = (start >= first) & (start <= last) & (cpu >= 0)
    if not keep.any():
        return {"switched_pct": float("nan"), "off_cpu_us_mean": float("nan")}
    off = np.clip(dur - cpu, 0, None)[keep]
    return {
        "switched_pct": float(100 * (switches[keep] > 0).mean()),
        "off_cpu_us_mean": float(off.mean() / 1e3),
    }


def shim_cost(calls: int, repeats: int) -> Recorder:
    """CPU-side cost per call (ns) of each shim setting, driven from C, ``repeats`` rounds."""
    from codl.trace import cuda_api

    lib = cuda_api.build_shim()
    got: dict[str, list[float]] = {label: [] for label, _, _ in SHIM_SETTINGS}
    rec = Recorder()
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "driver.c", Path(tmp) / "driver"
        src.write_text(SHIM_DRIVER)
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-O2", "-o", str(exe), str(src), "-ldl"], check=True)
        for _ in range(repeats):
            for label, armed, sched in SHIM_SETTINGS:
                out = subprocess.run(
                    [str(exe), str(lib), str(calls), str(armed), str(sched)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                got[label].append(float(out.stdout))
    for label, values in got.items():
        rec.add("callback, entry + exit", values, unit="ns", n=calls, statistic="mean call",
                setting=label)  # fmt: skip
    print(f"shim callback, {calls} calls x {repeats} repeats (CPU side only):")
    print(render(rec.measurements, column="setting", baseline="idle"))
    return rec


# The per-round fields a child reports that the table and CSV keep: (name, unit, statistic).
FIELDS = {
    "step_ms_median": ("step", "ms", "median step"),
    "launch_us_p50": ("launch p50", "us", "median cudaLaunchKernel"),
    "launch_calls_per_step": ("launches/step", "calls", "per step"),
    "api_calls_per_step": ("api calls/step", "calls", "per step"),
    # The scheduling evidence; absent from runs measured before it.
    "switched_pct": ("switched", "%", "calls with a context switch"),
    "off_cpu_us_mean": ("off-CPU", "us", "mean call"),
}


def record(rec: Recorder, df: Any, variants: list[str], measured: int) -> None:
    """Per variant and field, the rounds as a measurement, and each round's step time over the
    plain run's of the same round (a paired ratio: the rounds ran back to back)."""
    plain = df[df["variant"] == "plain"].set_index("round")["step_ms_median"]
    for v in variants:
        d = df[df["variant"] == v].sort_values("round")
        for col, (name, unit, how) in FIELDS.items():
            if col in d and d[col].notna().any():
                rec.add(name, d[col].dropna(), unit=unit, n=measured, statistic=how, variant=v)
        if v != "plain":
            ratio = d["step_ms_median"] / d["round"].map(plain)
            rec.add("step / plain", ratio.dropna(), unit="x", statistic=PAIRED, variant=v)


def rounds_of(measurements: list[Measurement]) -> Any:
    """The per-round frame ``record`` takes, back from a CSV it wrote (for ``--pool``)."""
    import pandas as pd

    by_name = {name: col for col, (name, _, _) in FIELDS.items()}
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for m in measurements:
        if m.name in by_name:
            v = m.setting["variant"]
            for i, x in enumerate(m.values):
                rows.setdefault((v, i), {"round": i, "variant": v})[by_name[m.name]] = x
    return pd.DataFrame(list(rows.values()))


def summary(rec: Recorder) -> None:
    """The table, and each variant's ratio to plain with its bootstrap 95 % interval."""
    print(render(rec.measurements, column="variant", baseline="plain"))
    for m in rec.measurements:
        if m.name == "step / plain":
            lo, hi = bootstrap_median(m.values)
            print(f"{m.setting['variant']:16s} {m.describe(4)}, 95 % CI [{lo:.4f}, {hi:.4f}]")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--measured", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="DDP ranks per run (NCCL, one GPU each; the question of the DDP step's cost)",
    )
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--csv", type=Path, default=Path("benchmarks/results/launch_api_cost.csv"))
    p.add_argument(
        "--shim-cost",
        action="store_true",
        help="time the shim's callback per call on the CPU (no GPU needed) and exit",
    )
    p.add_argument("--shim-calls", type=int, default=200_000)
    p.add_argument("--shim-csv", type=Path, default=Path("benchmarks/results/shim_cost.csv"))
    p.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        help="summarise earlier CSVs of one configuration instead of measuring",
    )
    args = p.parse_args(argv)
    if args.shim_cost:
        shim_cost(args.shim_calls, args.rounds).write(args.shim_csv)
        print(f"wrote {args.shim_csv}")
        return 0
    if args.pool:
        import pandas as pd

        # Rounds are numbered per file: each file's rounds keep their own plain reference.
        # A file is this benchmark's codl.measure CSV, or a per-round CSV written before it.
        frames = [
            pool_frame(f).assign(round=lambda d, i=i: d["round"] + 1000 * i)
            for i, f in enumerate(args.pool)
        ]
        pooled = pd.concat(frames, ignore_index=True)
        present = [v for v in VARIANTS if v in set(pooled["variant"])]
        rec = Recorder()
        record(rec, pooled, present, args.measured)
        summary(rec)
        rec.write(args.csv)
        print(f"pooled {len(args.pool)} files; wrote {args.csv}")
        return 0
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0
    variants = [v for v in args.variants.split(",") if v]
    if "plain" not in variants:
        raise SystemExit("--variants must include 'plain' (the reference of every ratio)")
    passthrough = [
        f"--model={args.model}",
        f"--batch-size={args.batch_size}",
        f"--image-size={args.image_size}",
        f"--warmup={args.warmup}",
        f"--measured={args.measured}",
        f"--ranks={args.ranks}",
    ]
    import pandas as pd

    rows: list[dict[str, Any]] = []
    rec = Recorder()
    for r in range(args.rounds):
        shift = r % len(variants)
        for order, v in enumerate(variants[shift:] + variants[:shift]):
            proc = subprocess.run(
                [sys.executable, __file__, f"--child={v}", *passthrough],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"round {r} variant {v} failed (exit {proc.returncode})")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append({"round": r, "order": order, **res})
            print(
                f"round {r} {v:15s} step {res['step_ms_median']:.3f} ms  "
                f"launch p50 {res['launch_us_p50']:.2f} us  {res['api_calls_per_step']:.0f} calls"
            )
        # Written after every round: a run cut short still leaves what it measured.
        record(rec, pd.DataFrame(rows), variants, args.measured)
        rec.write(args.csv)
    summary(rec)
    print(
        f"{args.model} b{args.batch_size}, {args.measured} measured steps, {args.rounds} rounds, "
        f"{args.ranks} rank(s)"
    )
    print(f"wrote {args.csv}")
    return 0


def pool_frame(path: Path) -> Any:
    import pandas as pd

    with path.open(encoding="utf-8") as fh:
        header = fh.readline()
    if header.startswith("name,"):
        return rounds_of(read_csv(path))
    return pd.read_csv(path)


if __name__ == "__main__":
    sys.exit(main())
