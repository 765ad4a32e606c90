"""Make tests/fixtures/kineto-2rank: a small real Kineto trace of two ranks for the HTA tests.

Two ranks of a small conv net (DDP) on ONE GPU: NCCL refuses two ranks on one device, so the
process group is gloo, which all-reduces CUDA tensors through host copies. torch.profiler
(CPU + CUDA activities, record_shapes off, no stacks) records ``--active`` steps after
``--warmup`` steps; cuDNN is off so the convolutions are native kernels launched through the
runtime API (cuDNN 9 launches through the driver API, which HTA's launch statistics leave out
and ours count; torch's own cuLaunchKernel calls remain, and the test accounts for them).
Per rank, into OUTDIR:

- ``rank<R>.pt.trace.json.gz``: Kineto's Chrome trace as torch.profiler exports it (with
  ``distributedInfo``), the file HTA reads, gzipped as codl keeps it (``codl.trace.kineto``);
- ``rank<R>.codl.json``: what codl's own path needs to read it: the clock anchor and the step
  spans (CLOCK_MONOTONIC, taken around each step as the harness does), and the launch
  statistics codl computes from them (``codl.trace.kineto.convert`` then
  ``codl.analysis.summarize.api_metrics``) when codl imports on the node, else null (the test
  recomputes them either way).

Run on the H200 node (from the repository root; one GPU is enough):

    PYTHONPATH=src python3 scripts/kineto_fixture.py tests/fixtures/kineto-2rank

The committed fixture was made so on 2026-12-01 (one H200, the node's torch 2.11.0+cu130,
Python 3.12, defaults: 3 warm-up and 3 profiled steps, batch 32), with the carried wheels
installed (``scripts/h200.sh setup``) so that codl imported there and its ``codl_launch_stats``
are the node's own, which ``tests/test_hta.py`` checks against this checkout's: 0.13-0.14 MB a
rank gzipped (the script refuses to finish above 2 MB).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

MAX_BYTES = 2 << 20


def _model(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def _codl_stats(
    doc: dict[str, Any], spans: dict[str, list[Any]], anchor: dict[str, int], warmup: int
) -> dict[str, Any] | None:
    """codl's launch statistics of this rank's Kineto trace, or None where codl does not
    import (the node's Python may lack codl's dependencies)."""
    try:
        import pandas as pd

        from codl.analysis.summarize import api_metrics
        from codl.trace.clock import Anchor
        from codl.trace.kineto import convert
    except ImportError as e:
        print(f"codl's statistics not computed here ({e}); the test computes them", flush=True)
        return None

    class _Spans:
        rows = spans

    cols, attrs = convert(doc, _Spans(), Anchor(**anchor))
    per_step = api_metrics(pd.DataFrame(cols), warmup=warmup)
    calls = int(per_step["launch_kernel_calls"].sum())
    mean = float((per_step["launch_kernel_us_mean"] * per_step["launch_kernel_calls"]).sum())
    return {
        "launch_kernel_calls": calls,
        "launch_kernel_us_mean": mean / calls if calls else None,
        "cupti_events": attrs["cupti_events"],
        "cupti_alignment_ns": attrs["cupti_alignment_ns"],
    }


def _rank(rank: int, world: int, out: Path, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    torch.backends.cudnn.enabled = False
    torch.manual_seed(rank)
    model = torch.nn.parallel.DistributedDataParallel(_model(torch).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(args.batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)

    m0 = time.monotonic_ns()
    real = time.time_ns()
    anchor = {"realtime_ns": real, "monotonic_ns": (m0 + time.monotonic_ns()) // 2, "error_ns": 0}
    spans: dict[str, list[Any]] = {k: [] for k in ("rank", "step", "phase", "start_ns", "end_ns")}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    steps = args.warmup + args.active
    with profile(
        activities=activities,
        schedule=schedule(wait=args.warmup - 1, warmup=1, active=args.active, repeat=1),
        record_shapes=False,
        with_stack=False,
    ) as prof:
        for step in range(steps):
            t0 = time.monotonic_ns()
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if cuda:
                torch.cuda.synchronize()
            t1 = time.monotonic_ns()
            for k, v in (
                ("rank", rank),
                ("step", step),
                ("phase", "step"),
                ("start_ns", t0),
                ("end_ns", t1),
            ):
                spans[k].append(v)
            prof.step()
    raw = out / f"rank{rank}.pt.trace.json"
    prof.export_chrome_trace(str(raw))
    doc = json.loads(raw.read_text())
    raw.unlink()
    gz = raw.with_suffix(".json.gz")
    with gzip.open(gz, "wt") as f:
        json.dump(doc, f)
    side = {
        "rank": rank,
        "world_size": world,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "warmup_steps": args.warmup,
        "active_steps": args.active,
        "anchor": anchor,
        "spans": spans,
        "codl_launch_stats": _codl_stats(doc, spans, anchor, args.warmup),
    }
    (out / f"rank{rank}.codl.json").write_text(json.dumps(side, indent=1) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    size = gz.stat().st_size
    print(f"rank {rank}: {gz} {size / 1e6:.2f} MB", flush=True)
    if size > MAX_BYTES:
        sys.exit(f"{gz}: {size} bytes, over {MAX_BYTES}: lower --active or --batch")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path)
    p.add_argument("--warmup", type=int, default=3, help="steps before the profiled ones (>= 1)")
    p.add_argument("--active", type=int, default=3, help="profiled steps")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--cpu", action="store_true", help="no CUDA (checks the harness only)")
    args = p.parse_args()
    if args.warmup < 1 or args.active < 1:
        p.error("--warmup and --active must be >= 1")
    args.outdir.mkdir(parents=True, exist_ok=True)
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(2, args.outdir, args), nprocs=2, join=True)


if __name__ == "__main__":
    main()
