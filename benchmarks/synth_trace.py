"""A realistic synthetic trace for the summarize benchmark: every table the tracer writes for a
`combined` run with the `cuda_api` level, over several ranks, at a chosen number of events.

Per rank and step: the app's phase spans (step, data wait, H2D, forward, backward, optimizer,
compute), 4 AllReduce buckets (host spans, and their GPU times in events/comm_gpu), a scheduler
sample of each of its threads, one /proc/stat sample of each of the node's 16 cores (every rank
takes its own, as the tracer does), the launch and autograd threads' counters across the
compute and data-wait spans (events/phase_sched), one NVML sample of its GPU, ~2,100 CUDA
runtime calls of a real name mix (launches, copies, events, syncs; log-normal latencies with a
rare slow tail) and the loader's rows for the batch (fetch, decode, transform per item on 4
workers, one collate). Rank after rank, each rank's rows in time order, as ``merge_rank_traces``
writes a multi-rank run's trace (``make_rank_parts`` writes the rank traces it merges; before
2026-12-03 the ranks took turns every 100 steps, an order no merged trace has). That is ~72 %
CUDA API rows, ~26 % loader rows and the rest small tables. Root attributes are those of a real
run (a committed golden trace's), with the layout and levels adjusted.

    PYTHONPATH=src python benchmarks/synth_trace.py OUT.h5 --events 10000000
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from codl.spec import RunSpec
from codl.trace.store import TraceWriter, open_trace

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "traces" / "r2_combined.h5.gz"
STEP_NS = 100_000_000
T0 = 10**12
# name, share of runtime calls, median latency (us): a ResNet step's runtime API mix.
API_MIX = (
    ("cudaLaunchKernel", 0.62, 3.5),
    ("cudaLaunchKernelExC", 0.04, 4.0),
    ("cuLaunchKernel", 0.06, 3.0),
    ("cudaMemcpyAsync", 0.06, 8.0),
    ("cudaMemsetAsync", 0.04, 3.0),
    ("cudaEventRecord", 0.08, 1.5),
    ("cudaStreamWaitEvent", 0.05, 1.2),
    ("cudaEventQuery", 0.03, 0.8),
    ("cudaStreamSynchronize", 0.01, 150.0),
    ("cudaFuncGetAttributes", 0.01, 0.6),
)
CALLS_PER_STEP = 2_100
ITEMS_PER_STEP = 250
WORKERS = 4
THREADS_PER_RANK = 12
CORES = 16  # the /proc/stat lines a rank samples: the H200 node's 16 cores per GPU
PHASES = ("data_wait", "h2d", "forward", "backward", "optimizer", "compute", "step")
# Per rank and step: calls, loader rows (3 per item, 1 collate), sched samples, app spans,
# buckets and their GPU rows, core samples, phase counters (2 spans x 2 threads), device sample.
EVENTS_PER_RANK_STEP = (
    CALLS_PER_STEP + 3 * ITEMS_PER_STEP + 1 + THREADS_PER_RANK + 7 + 2 * 4 + CORES + 4 + 1
)


def _golden_attrs(ranks: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.h5"
        with gzip.open(GOLDEN, "rb") as src, path.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        with open_trace(path) as t:
            attrs = t.attrs
    spec = attrs["spec"]
    spec["layout"]["ranks_per_node"] = ranks
    spec["loader"]["workers"] = WORKERS
    spec["trace"]["cuda_api"] = True
    spec["device"] = "cuda"
    keep = ("allowed_cpus", "anchors_start", "anchors_end", "clk_tck", "host", "versions")
    out = {k: attrs[k] for k in keep if k in attrs}
    # A merged trace lists its ranks (each with its clock anchors): rank 0's for every rank.
    out["ranks"] = [{**attrs["ranks"][0], "rank": r} for r in range(ranks)]
    out.update(spec=spec, world_size=ranks, warmup_steps=2, run_id=RunSpec.from_dict(spec).run_id)
    return out


def _app(rank: int, steps: np.ndarray, t: np.ndarray, tid: int) -> dict[str, Any]:
    n = len(steps)
    # Phase bounds as fractions of the step: data wait, H2D, forward, backward, optimizer.
    edges = np.array([0.0, 0.05, 0.07, 0.37, 0.9, 0.98])
    starts = [t + (edges[i] * STEP_NS).astype(np.int64) for i in range(5)]
    ends = [t + (edges[i + 1] * STEP_NS).astype(np.int64) for i in range(5)]
    starts += [starts[2], t]
    ends += [ends[4], t + STEP_NS - 1000]
    return {
        "rank": np.full(7 * n, rank, np.int16),
        "step": np.tile(steps, 7),
        "phase": np.repeat(np.array(PHASES, object), n),
        "tid": np.full(7 * n, tid),
        "start_ns": np.concatenate(starts),
        "end_ns": np.concatenate(ends),
        "gpu_ns": np.full(7 * n, -1),
    }


def _cuda(rng: np.random.Generator, rank: int, steps: np.ndarray, t: np.ndarray, tid: int) -> dict:
    n = len(steps) * CALLS_PER_STEP
    names = np.array([m[0] for m in API_MIX], object)
    share = np.array([m[1] for m in API_MIX])
    pick = rng.choice(len(API_MIX), n, p=share / share.sum())
    med = np.array([m[2] for m in API_MIX])[pick] * 1e3
    dur = (med * rng.lognormal(0.0, 0.5, n)).astype(np.int64) + 200
    slow = rng.random(n) < 1e-3  # preempted calls: a timeslice or more
    dur[slow] += rng.integers(100_000, 4_000_000, int(slow.sum()))
    # Calls spread over the forward and backward (7 %..90 % of the step), in time order.
    off = np.sort(
        rng.integers(int(0.07 * STEP_NS), int(0.9 * STEP_NS), n).reshape(-1, CALLS_PER_STEP)
    )
    start = (t[:, None] + off).ravel()
    return {
        "rank": np.full(n, rank, np.int16),
        "step": np.repeat(steps, CALLS_PER_STEP),
        "kind": np.full(n, "runtime", object),
        "name": names[pick],
        "tid": np.full(n, tid),
        "stream": np.full(n, -1),
        "correlation": np.arange(n) + int(steps[0]) * CALLS_PER_STEP,
        "start_ns": start,
        "end_ns": start + dur,
    }


def _loader(rng: np.random.Generator, rank: int, steps: np.ndarray, t: np.ndarray) -> dict:
    """The batch of step s, loaded during step s - 1 by the workers, items dealt round-robin."""
    n_items = len(steps) * ITEMS_PER_STEP
    per_worker = ITEMS_PER_STEP // WORKERS + 1
    item = np.arange(n_items) + int(steps[0]) * ITEMS_PER_STEP
    worker = item % WORKERS
    slot = (item % ITEMS_PER_STEP) // WORKERS
    step = np.repeat(steps, ITEMS_PER_STEP)
    base = np.repeat(t - STEP_NS, ITEMS_PER_STEP) + slot * (STEP_NS // per_worker)
    durs = [rng.lognormal(np.log(m), 0.4, n_items).astype(np.int64) for m in (3e5, 8e5, 4e5)]
    starts = [base, base + durs[0], base + durs[0] + durs[1]]
    start = np.concatenate([*starts, t - 2_000_000])
    end = np.concatenate([s + d for s, d in zip(starts, durs, strict=True)] + [t - 1_000_000])
    stage = np.repeat(np.array(["fetch", "decode", "transform"], object), n_items)
    order = np.argsort(start, kind="stable")
    w = np.concatenate([np.tile(worker, 3), np.zeros(len(steps), np.int64)])[order]
    return {
        "rank": np.full(len(start), rank, np.int16),
        "step": np.concatenate([np.tile(step, 3), steps])[order],
        "worker": w.astype(np.int16),
        "pid": 20_000 + 100 * rank + w,
        "tid": 20_000 + 100 * rank + w,
        "cpu": (4 + w).astype(np.int16),
        "item": np.concatenate([np.tile(item, 3), np.full(len(steps), -1)])[order],
        "stage": np.concatenate([stage, np.full(len(steps), "collate", object)])[order],
        "start_ns": start[order],
        "end_ns": end[order],
    }


def _threads(rank: int) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """The rank's threads (role, name, CPU mask) and their (pid, tid)."""
    pid = 10_000 + 100 * rank
    roles = ["launch", "autograd", "pin_memory", "comm", "comm", "other", "other", "other"]
    ids = [(pid, pid + i) for i in range(len(roles))]
    ids += [(20_000 + 100 * rank + w, 20_000 + 100 * rank + w) for w in range(WORKERS)]
    roles += ["loader"] * WORKERS
    names = ["python", "pt_autograd_0", "python", "gloo_tcp_loop", "pt_gloo_runloop"]
    names += ["python"] * 3 + ["pt_data_worker"] * WORKERS
    cpus = ["0-1", "0-1", "0-1", "0-15", "0-15", "0-15", "0-15", "0-15"]
    cpus += [f"{4 + w}" for w in range(WORKERS)]
    n = len(roles)
    table = {
        "t_ns": np.full(n, T0),
        "rank": np.full(n, rank, np.int16),
        "pid": np.array([p for p, _ in ids]),
        "tid": np.array([t for _, t in ids]),
        "role": np.array(roles, object),
        "name": np.array(names, object),
        "cpus_planned": np.array(cpus, object),
        "cpus_actual": np.array(cpus, object),
    }
    return table, ids


def _small(rng: np.random.Generator, rank: int, steps: np.ndarray, t: np.ndarray) -> dict:
    """samples/sched (each thread at each step's end, cumulative) and events/comm."""
    _, ids = _threads(rank)
    k, n = len(ids), len(steps)
    run = np.cumsum(rng.integers(0, 30_000_000, (n, k)), axis=0) + int(steps[0]) * 15_000_000
    wait = np.cumsum(rng.integers(0, 2_000_000, (n, k)), axis=0) + int(steps[0]) * 1_000_000
    ticks = np.repeat(np.arange(n) + int(steps[0]), k)
    sched = {
        "t_ns": np.repeat(t + STEP_NS, k),
        "rank": np.full(n * k, rank, np.int16),
        "step": np.repeat(steps, k),
        "pid": np.tile([p for p, _ in ids], n),
        "tid": np.tile([i for _, i in ids], n),
        "run_ns": run.ravel(),
        "wait_ns": wait.ravel(),
        "timeslices": ticks * 40,
        "voluntary": ticks * 20,
        "involuntary": ticks * 3,
        "cpu": np.zeros(n * k, np.int16),
    }
    start = (t[:, None] + np.array([0.8, 0.84, 0.88, 0.92]) * STEP_NS).astype(np.int64).ravel()
    comm = {
        "rank": np.full(4 * n, rank, np.int16),
        "step": np.repeat(steps, 4),
        "bucket": np.tile(np.arange(4), n),
        "op": np.full(4 * n, "allreduce", object),
        "bytes": np.full(4 * n, 25 << 20),
        "start_ns": start,
        "end_ns": start + rng.integers(1_000_000, 3_000_000, 4 * n),
    }
    # CUDA events time each bucket on the GPU: its duration in gpu_ns, its times in comm_gpu.
    gpu_start = start + rng.integers(10_000, 200_000, 4 * n)
    gpu_ns = rng.integers(800_000, 2_500_000, 4 * n)
    comm["gpu_ns"] = gpu_ns
    comm_gpu = {
        "rank": comm["rank"],
        "step": comm["step"],
        "bucket": comm["bucket"],
        "start_ns": gpu_start,
        "end_ns": gpu_start + gpu_ns,
    }
    return {"samples/sched": sched, "events/comm": comm, "events/comm_gpu": comm_gpu}


def _per_step_samples(
    rng: np.random.Generator, rank: int, steps: np.ndarray, t: np.ndarray
) -> dict:
    """samples/cpu (each core's cumulative ticks at each step's end, 100 Hz), samples/device
    (the rank's GPU) and events/phase_sched (the launch and autograd threads' counters across
    the data-wait and compute spans)."""
    n = len(steps)
    done = (steps.astype(np.int64) + 1)[:, None]  # steps ended: ticks accumulate ~10 a step
    jitter = rng.integers(0, 2, (n, CORES))
    cpu = {
        "t_ns": np.repeat(t + STEP_NS, CORES),
        "rank": np.full(n * CORES, rank, np.int16),
        "step": np.repeat(steps, CORES),
        "cpu": np.tile(np.arange(CORES, dtype=np.int16), n),
        "user": (done * 6 + jitter).ravel(),
        "system": (done * 2).repeat(CORES, axis=1).ravel(),
        "idle": (done * 2 - jitter).ravel(),
        "iowait": np.zeros(n * CORES, np.int64),
        "other": np.zeros(n * CORES, np.int64),
    }
    device = {
        "t_ns": t + STEP_NS,
        "rank": np.full(n, rank, np.int16),
        "step": steps,
        "gpu": np.full(n, rank, np.int16),
        "util_pct": np.full(n, 92, np.int16),
        "mem_util_pct": np.full(n, 41, np.int16),
        "mem_used": np.full(n, 40 << 30),
        "sm_clock": np.full(n, 1980, np.int32),
        "power": rng.integers(450_000, 600_000, n),
    }
    # (phase, start and end as fractions of the step) as _app lays them out, for 2 threads.
    spans = (("data_wait", 0.0, 0.05), ("compute", 0.07, 0.98))
    pid = 10_000 + 100 * rank
    rows: dict[str, list[np.ndarray]] = {c: [] for c in ("phase", "tid", "start", "end", "run")}
    for phase, lo, hi in spans:
        for tid, busy in ((pid, 0.9), (pid + 1, 0.5)):
            length = int((hi - lo) * STEP_NS)
            rows["phase"].append(np.full(n, phase, object))
            rows["tid"].append(np.full(n, tid))
            rows["start"].append(t + int(lo * STEP_NS))
            rows["end"].append(t + int(lo * STEP_NS) + length)
            rows["run"].append((busy * length * rng.uniform(0.9, 1.0, n)).astype(np.int64))
    k = len(spans) * 2
    run = np.concatenate(rows["run"])
    phase_sched = {
        "rank": np.full(k * n, rank, np.int16),
        "step": np.tile(steps, k),
        "phase": np.concatenate(rows["phase"]),
        "tid": np.concatenate(rows["tid"]),
        "start_ns": np.concatenate(rows["start"]),
        "end_ns": np.concatenate(rows["end"]),
        "run_ns": run,
        "wait_ns": rng.integers(0, 2_000_000, k * n),
        "timeslices": run // 4_000_000 + 1,
    }
    return {"samples/cpu": cpu, "samples/device": device, "events/phase_sched": phase_sched}


def _rank_rounds(
    rng: np.random.Generator, rank: int, steps_per_rank: int, round_steps: int
) -> Iterator[dict[str, dict[str, Any]]]:
    """A rank's tables, ``round_steps`` steps at a time (bounded memory at any size)."""
    tid = 10_000 + 100 * rank
    for lo in range(0, steps_per_rank, round_steps):
        steps = np.arange(lo, min(steps_per_rank, lo + round_steps), dtype=np.int32)
        t = T0 + steps.astype(np.int64) * STEP_NS
        yield {
            "events/app": _app(rank, steps, t, tid),
            "events/cuda": _cuda(rng, rank, steps, t, tid),
            "events/loader": _loader(rng, rank, steps, t),
            **_small(rng, rank, steps, t),
            **_per_step_samples(rng, rank, steps, t),
        }


def _append_rank(w: TraceWriter, rounds: Iterator[dict[str, dict[str, Any]]]) -> int:
    written = 0
    for tables in rounds:
        for name, cols in tables.items():
            w.append(name, cols)
            written += len(next(iter(cols.values())))
    return written


def _span(steps_per_rank: int) -> dict[str, int]:
    """The run's begin and end (root attributes the tracer writes): its steps and one more."""
    return {"t_begin_ns": T0, "t_end_ns": T0 + (steps_per_rank + 1) * STEP_NS}


def _steps_per_rank(events: int, ranks: int) -> int:
    return max(4, round(events / (ranks * EVENTS_PER_RANK_STEP)))


def make_trace(
    path: Path, events: int, *, ranks: int = 4, round_steps: int = 100, repeat: int = 0
) -> int:
    """Write a trace of about ``events`` events over ``ranks`` ranks; returns the events.
    Rank after rank, each rank's rows in time order: the order ``merge_rank_traces`` gives a
    multi-rank run's trace. ``repeat``: the run's repeat index (its own run id, its own
    random rows), for a matrix of several runs."""
    steps_per_rank = _steps_per_rank(events, ranks)
    rng = np.random.default_rng(repeat)
    written = 0
    attrs = _golden_attrs(ranks)
    if repeat:
        attrs["spec"]["repeat"] = repeat
        attrs["run_id"] = RunSpec.from_dict(attrs["spec"]).run_id
    with TraceWriter(path) as w:
        w.set_attrs(**attrs, **_span(steps_per_rank))
        for rank in range(ranks):
            w.append("threads", _threads(rank)[0])
        for rank in range(ranks):
            written += _append_rank(w, _rank_rounds(rng, rank, steps_per_rank, round_steps))
        w.finish()
    return written


def make_rank_parts(path: Path, events: int, *, ranks: int = 4, round_steps: int = 100) -> int:
    """The rank traces (``merge.rank_trace_path(path, r)``) that a ``ranks``-rank run leaves
    for ``merge_rank_traces(path, ranks)``: ``make_trace``'s rows, each rank in its own file
    with its own root attributes; returns the events."""
    from codl.trace.store.merge import rank_trace_path

    steps_per_rank = _steps_per_rank(events, ranks)
    rng = np.random.default_rng(0)
    merged = _golden_attrs(ranks)
    written = 0
    for rank in range(ranks):
        attrs = {k: v for k, v in merged.items() if k != "ranks"}
        attrs.update(rank=rank, **_span(steps_per_rank))
        with TraceWriter(rank_trace_path(path, rank)) as w:
            w.set_attrs(**attrs)
            w.append("threads", _threads(rank)[0])
            written += _append_rank(w, _rank_rounds(rng, rank, steps_per_rank, round_steps))
            w.finish()
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--ranks", type=int, default=4)
    args = p.parse_args()
    n = make_trace(args.out, args.events, ranks=args.ranks)
    print(json.dumps({"path": str(args.out), "events": n}))


if __name__ == "__main__":
    main()
