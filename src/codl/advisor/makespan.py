"""Makespan of a queue of jobs sharing a node's cores (A-Dloader's second measure), pure.

A node has ``cores`` CPU cores and ``slots`` jobs' worth of accelerators; a queue of jobs (each a
workload with a number of samples to process) runs at most ``slots`` at a time, in queue order.
A *plan* says how the cores are split among the running jobs, decided again at every event (a
job starts or ends):

- ``even``: each slot owns ``cores / slots`` cores for good (the node partitioned per GPU); a
  job takes its slot's cores, and cores of an empty slot stay idle.
- ``even-resplit``: the cores split evenly among the running jobs at every event (freed cores
  go to the jobs still running), so re-splitting alone is told from an uneven split.
- ``advised``: at every event the split of the cores among the running jobs that minimises the
  longest predicted remaining time, ``max_j R_j / X_j(c_j)`` (a job's remaining samples over
  its rate on its share; ties: the split closest to even). A heuristic: it plans the running
  jobs, not the queue behind them.

``simulate`` runs a plan: the split is decided from the *planning* rates (the model's
predictions, ``advise.advise(fit, cores=c)``), the jobs progress at the *executing* rates. With
both the model's, the makespan is the advisor's prediction; executed at measured rates
(``measured_rates``: the best measured setting of a job at each core budget of its tables,
``interpolated`` between budgets) it is a trace-driven simulation of what the plan would take.
Rates are per job, a function of its cores; a job's rate does not depend on the other jobs
(jobs share CPUs only: docs/advisor.md, "Sharing a node").
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from codl.advisor import model as mdl
from codl.advisor.advise import compositions

Rate = Callable[[int], float]
#: Relative tolerance of the advised split's min-max: splits within it count as equal.
TIE = 1e-9


class Plan(enum.StrEnum):
    EVEN = "even"
    EVEN_RESPLIT = "even-resplit"
    ADVISED = "advised"


@dataclass(frozen=True, kw_only=True)
class Job:
    name: str
    workload: str  # the key of its rates (jobs of one workload share them)
    samples: float


class MakespanError(mdl.ModelError):
    """A queue or node the plans cannot run (no job, fewer cores than jobs)."""


def _even(total: int, parts: int) -> tuple[int, ...]:
    base, extra = divmod(total, parts)
    return tuple(base + (i < extra) for i in range(parts))


def advised_split(remaining: Sequence[float], rates: Sequence[Rate], cores: int) -> tuple[int, ...]:
    """Cores per running job minimising the longest predicted remaining time."""
    even = cores / len(remaining)
    best: tuple[float, float, tuple[int, ...]] | None = None
    for split in compositions(cores, len(remaining)):
        times = [
            r / x if (x := rate(c)) > 0 else math.inf
            for r, rate, c in zip(remaining, rates, split, strict=True)
        ]
        key = (max(times), sum(abs(c - even) for c in split))
        if (
            best is None
            or key[0] < best[0] * (1 - TIE)
            or (key[0] <= best[0] * (1 + TIE) and key[1] < best[1])
        ):
            best = (key[0], key[1], split)
    if best is None:
        raise mdl.ModelError(
            f"{len(remaining)} running jobs on {cores} cores: no split gives each job a core"
        )
    return best[2]


def simulate(
    jobs: Sequence[Job],
    *,
    cores: int,
    slots: int,
    plan: Plan,
    planning: Mapping[str, Rate],
    executing: Mapping[str, Rate] | None = None,
) -> pd.DataFrame:
    """The schedule of ``plan``: one row per (segment, running job) with ``start``, ``end`` (s),
    ``job``, ``workload``, ``cores``, ``rate`` (executing, samples/s) and ``samples`` done in
    the segment. ``planning`` rates decide the advised split; ``executing`` rates (default: the
    planning ones) move the jobs. A job that can make no progress on its share ends the
    schedule with ``end`` = inf."""
    if not jobs:
        raise MakespanError("makespan: an empty queue")
    if slots < 1 or cores < slots:
        raise MakespanError(f"makespan: {cores} cores for {slots} slots; need cores >= slots >= 1")
    run = executing if executing is not None else planning
    missing = sorted({j.workload for j in jobs} - set(planning) - set(run))
    if missing:
        raise MakespanError(f"makespan: no rates for workload(s) {missing}")
    queue = list(range(len(jobs)))
    remaining = [float(j.samples) for j in jobs]
    slot_of: dict[int, int] = {}
    t = 0.0
    rows: list[dict[str, object]] = []
    while queue or slot_of:
        free = [s for s in range(slots) if s not in slot_of.values()]
        while queue and free:
            slot_of[queue.pop(0)] = free.pop(0)
        running = sorted(slot_of)
        if plan is Plan.EVEN:
            share = _even(cores, slots)
            split = tuple(share[slot_of[i]] for i in running)
        elif plan is Plan.EVEN_RESPLIT:
            split = _even(cores, len(running))
        else:
            split = advised_split(
                [remaining[i] for i in running],
                [planning[jobs[i].workload] for i in running],
                cores,
            )
        rates = [run[jobs[i].workload](c) for i, c in zip(running, split, strict=True)]
        dt = min(
            (remaining[i] / x if x > 0 else math.inf for i, x in zip(running, rates, strict=True)),
        )
        for i, c, x in zip(running, split, rates, strict=True):
            done = min(remaining[i], x * dt) if math.isfinite(dt) else 0.0
            rows.append(
                {
                    "start": t,
                    "end": t + dt,
                    "job": jobs[i].name,
                    "workload": jobs[i].workload,
                    "cores": c,
                    "rate": x,
                    "samples": done,
                }
            )
            remaining[i] -= done
        if not math.isfinite(dt):
            break
        t += dt
        for i in running:
            # A relative epsilon: a job whose remainder is rounding noise has finished.
            if remaining[i] <= 1e-9 * jobs[i].samples:
                del slot_of[i]
    return pd.DataFrame(rows)


def makespan(schedule: pd.DataFrame) -> float:
    return float(schedule["end"].max())


def interpolated(table: pd.DataFrame) -> Rate:
    """A job's rate at any core count from its measured ``cores``/``throughput`` rows: linear
    between measured budgets, the largest budget's above it, and proportional to the cores
    below the smallest (``throughput * c / c_min``: a loader-bound job's rate falls with its
    cores; docs/advisor.md says which segments this reaches)."""
    t = table.sort_values("cores")
    c = t["cores"].to_numpy(np.float64)
    x = t["throughput"].to_numpy(np.float64)

    def rate(cores: int) -> float:
        if cores <= 0:
            return 0.0
        if cores < c[0]:
            return float(x[0] * cores / c[0])
        return float(np.interp(cores, c, x))

    return rate


def measured_rates(data: mdl.RunData) -> pd.DataFrame:
    """The best measured combined setting of a job at each core budget of its runs: ``cores``,
    ``throughput`` (per rank, as the model reads a run: a drained window's production),
    ``policy``, ``workers``, ``runs``."""
    g = mdl.group_stats(data)
    g = g[g["mode"] == data.node.combined_mode].copy()
    g["cores"] = g["cores"].astype(float)
    if g["cores"].isna().any():
        raise MakespanError(
            "makespan: combined runs without `cpus` in runs.csv: their core budget is unknown"
        )
    best = g.sort_values("throughput", ascending=False).groupby("cores", as_index=False).first()
    best["cores"] = best["cores"].astype(int)
    return best[["cores", "throughput", "policy", "workers", "runs"]].sort_values("cores")


def plan_table(
    jobs: Sequence[Job],
    *,
    cores: int,
    slots: int,
    predicted: Mapping[str, Rate],
    measured: Mapping[str, Rate] | None = None,
    measured_budgets: Mapping[str, Sequence[int]] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Makespan of every plan: predicted (planned and executed at the model's rates) and, with
    ``measured``, simulated (planned at the model's rates, executed at the measured ones). One
    row per plan: ``predicted_s``, ``simulated_s``, each against ``even`` (``*_vs_even`` =
    plan / even - 1), and ``measured_share``: the fraction of the simulated job-seconds spent at
    a core budget that was measured (the rest is interpolated). And every schedule's segments
    (``plan``, ``kind``: predicted or simulated)."""
    rows, segments = [], []
    for plan in Plan:
        pred = simulate(jobs, cores=cores, slots=slots, plan=plan, planning=predicted)
        segments.append(pred.assign(plan=plan.value, kind="predicted"))
        row: dict[str, object] = {"plan": plan.value, "predicted_s": makespan(pred)}
        if measured is not None:
            sim = simulate(
                jobs, cores=cores, slots=slots, plan=plan, planning=predicted, executing=measured
            )
            segments.append(sim.assign(plan=plan.value, kind="simulated"))
            row["simulated_s"] = makespan(sim)
            if measured_budgets is not None:
                span = sim["end"] - sim["start"]
                at = [
                    int(c) in set(measured_budgets.get(w, ()))
                    for w, c in zip(sim["workload"], sim["cores"], strict=True)
                ]
                row["measured_share"] = float(span[at].sum() / span.sum())
        rows.append(row)
    table = pd.DataFrame(rows)
    for col in ("predicted_s", "simulated_s"):
        if col in table:
            even = float(table.loc[table["plan"] == Plan.EVEN.value, col].iloc[0])
            table[col.replace("_s", "_vs_even")] = table[col] / even - 1
    return table, pd.concat(segments, ignore_index=True)
