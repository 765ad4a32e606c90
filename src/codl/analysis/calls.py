"""Per-call attribution of slow CUDA API calls (docs/design.md sect. 9, issue 14 item 4).

Input: a run's ``events/cuda`` rows from the ``cuda_api`` level, its ``events/cuda_sched``
evidence (``trace.cuda_api_sched``: the calling thread's CPU time and context-switch counts
between entry and exit of every call), optionally its ``threads`` and ``samples/sched`` tables,
and the isolation twin's ``events/cuda`` rows. Output: one row per slow call, and a summary.

A call is *slow* when its duration exceeds ``factor`` x the twin's p50 for that API name (or an
absolute ``threshold_ns``). Its *excess* is the duration beyond the baseline (the twin's p50,
or the run's own p50 for a name the twin never called or when no twin is given). The excess is
split into:

- off-CPU time (duration - thread CPU time), up to the excess: the baseline is what the call
  takes when nothing gets in its way, which is essentially on-CPU time, so time away from the
  CPU is the first suspect. It is **preempted** when only involuntary switches happened in the
  call (the thread was runnable and the scheduler ran something else: run-queue wait),
  **blocked** when only voluntary switches happened (it slept: a full launch queue behind a
  stalled stream, a lock, a page of pinned memory);
- **on_cpu**: the rest of the excess (the thread ran longer: driver work, contention in
  caches or memory bandwidth; also interrupts and hypervisor steal, which take the CPU without
  a context switch).

When both kinds of switches happened in one call, the counters cannot say which interval was
which: the off-CPU part is split in proportion to the switch counts (each switch-out gets an
equal share) and the call is classed **mixed**. A voluntary switch-out includes the run-queue
wait after the wake-up (the thread left voluntarily; when it became runnable again it may have
waited for the CPU): "blocked" is an upper bound of the time blocked, "preempted" a lower bound
of run-queue wait. The exact split needs scheduler events (sched_switch/sched_wakeup).

Classes: the largest of preempted / blocked / on_cpu, ``mixed`` when both switch kinds
happened (a call over an absolute threshold but within its baseline is classed by its whole
duration, its parts left 0), ``unknown`` when the call has no evidence (the level ran without
``trace.cuda_api_sched``, or the call nested too deep for the shim to keep it).

Threads that may have taken the CPU (best effort, ``peers_known`` says whether it could be
judged): ``samples/sched`` has each thread's cumulative run time and last CPU at every step
boundary; a thread is listed when it ran between the samples that bracket the call and was last
seen on the caller's CPU at one of them, or is pinned to that CPU alone (``threads``'
``cpus_actual``); a thread whose mask excludes that CPU is never listed. Samples are per step,
so this is a list of candidates, not proof that they ran inside the call.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.trace.schema import Table
from codl.trace.store import open_trace

API_KINDS = ("runtime", "sync")
EVIDENCE_KEYS = ["rank", "tid", "correlation", "start_ns"]
CALL_COLUMNS = (
    "run",
    "rank",
    "tid",
    "role",
    "name",
    "start_ns",
    "duration_ns",
    "baseline_ns",
    "baseline_source",
    "excess_ns",
    "off_cpu_ns",
    "preempted_ns",
    "blocked_ns",
    "on_cpu_ns",
    "voluntary",
    "involuntary",
    "class",
    "cpu",
    "cpu_peers",
    "peers_known",
)
PARTS = ("preempted_ns", "blocked_ns", "on_cpu_ns")


class CallClass(enum.StrEnum):
    PREEMPTED = "preempted"
    BLOCKED = "blocked"
    ON_CPU = "on_cpu"
    MIXED = "mixed"
    UNKNOWN = "unknown"


@dataclass(frozen=True, kw_only=True)
class SlowCallRule:
    """Which calls are slow: ``duration > factor x baseline``, or ``duration > threshold_ns``
    when that is given (it takes precedence; without a twin it is required)."""

    factor: float = 5.0
    threshold_ns: int | None = None

    def __post_init__(self) -> None:
        if not self.factor > 1.0:
            raise ValueError(f"SlowCallRule.factor: got {self.factor}, expected > 1")
        if self.threshold_ns is not None and self.threshold_ns <= 0:
            raise ValueError(f"SlowCallRule.threshold_ns: got {self.threshold_ns}, expected > 0")


@dataclass(frozen=True)
class Split:
    """One call's excess split (ns) and its class."""

    preempted_ns: int
    blocked_ns: int
    on_cpu_ns: int
    off_cpu_ns: int
    cls: CallClass


def split_excess(
    *, duration_ns: int, excess_ns: int, thread_cpu_ns: int, voluntary: int, involuntary: int
) -> Split:
    """The documented rule of this module for one call; ``thread_cpu_ns < 0`` = no evidence."""
    excess = max(0, excess_ns)
    if thread_cpu_ns < 0 or voluntary < 0 or involuntary < 0:
        return Split(0, 0, 0, -1, CallClass.UNKNOWN)
    # The shim reads the CPU clock outside the two latency stamps, so thread CPU time can exceed
    # the duration by a few hundred ns of syscall: no negative off-CPU time.
    off = min(max(0, duration_ns - thread_cpu_ns), max(0, duration_ns))
    off_excess = min(off, excess)
    switches = voluntary + involuntary
    if switches == 0:
        # Off CPU without a context switch: interrupts or steal; the scheduler saw it running.
        return Split(0, 0, excess, off, CallClass.ON_CPU)
    preempted = round(off_excess * involuntary / switches)
    blocked = off_excess - preempted
    on_cpu = excess - off_excess
    if voluntary and involuntary:
        cls = CallClass.MIXED
    elif excess == 0:
        # Over an absolute threshold but not over its baseline: class the whole call instead.
        return dataclasses.replace(
            split_excess(
                duration_ns=duration_ns,
                excess_ns=duration_ns,
                thread_cpu_ns=thread_cpu_ns,
                voluntary=voluntary,
                involuntary=involuntary,
            ),
            preempted_ns=0,
            blocked_ns=0,
            on_cpu_ns=0,
        )
    else:
        parts = {
            CallClass.PREEMPTED: preempted,
            CallClass.BLOCKED: blocked,
            CallClass.ON_CPU: on_cpu,
        }
        cls = max(parts, key=lambda c: parts[c])
    return Split(preempted, blocked, on_cpu, off, cls)


def _durations(calls: pd.DataFrame) -> pd.DataFrame:
    api = calls[calls["kind"].astype(str).isin(API_KINDS)].copy()
    api["name"] = api["name"].astype(str)
    api["duration_ns"] = (api["end_ns"] - api["start_ns"]).astype(np.int64)
    return api


def baselines(calls: pd.DataFrame, twin: pd.DataFrame | None) -> pd.DataFrame:
    """p50 duration per API name: the twin's where it called that name, else the run's own."""
    own = _durations(calls).groupby("name")["duration_ns"].median()
    out = pd.DataFrame({"baseline_ns": own, "baseline_source": "self"})
    if twin is not None:
        theirs = _durations(twin).groupby("name")["duration_ns"].median()
        common = out.index.intersection(theirs.index)
        out.loc[common, "baseline_ns"] = theirs[common]
        out.loc[common, "baseline_source"] = "twin"
    out.index.name = "name"
    return out.reset_index()


def _roles(threads: pd.DataFrame | None) -> dict[tuple[int, int], str]:
    if threads is None or threads.empty:
        return {}
    last = threads.sort_values("t_ns").drop_duplicates(["rank", "tid"], keep="last")
    return {
        (int(r), int(t)): str(role)
        for r, t, role in zip(last["rank"], last["tid"], last["role"], strict=True)
    }


def parse_cpulist(text: str) -> frozenset[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}; '' -> empty (unknown)."""
    out: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            continue
        lo, _, hi = part.strip().partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


@dataclass(frozen=True)
class _ThreadSamples:
    t_ns: npt.NDArray[np.int64]
    run_ns: npt.NDArray[np.int64]
    cpu: npt.NDArray[np.int64]


class CpuPeers:
    """Which threads may have run on a CPU during an interval, from per-step sched samples."""

    def __init__(self, samples: pd.DataFrame | None, threads: pd.DataFrame | None) -> None:
        self.by_tid: dict[int, _ThreadSamples] = {}
        if samples is not None and not samples.empty:
            ordered = samples.sort_values("t_ns")
            for tid, g in ordered.groupby("tid"):
                self.by_tid[int(cast(int, tid))] = _ThreadSamples(
                    g["t_ns"].to_numpy(np.int64),
                    g["run_ns"].to_numpy(np.int64),
                    g["cpu"].to_numpy(np.int64),
                )
        self.masks: dict[int, frozenset[int]] = {}
        self.roles: dict[int, str] = {}
        if threads is not None and not threads.empty:
            last = threads.sort_values("t_ns").drop_duplicates("tid", keep="last")
            for tid, cpus, role in zip(last["tid"], last["cpus_actual"], last["role"], strict=True):
                self.masks[int(tid)] = parse_cpulist(str(cpus))
                self.roles[int(tid)] = str(role)

    def caller_cpu(self, tid: int, t_ns: int) -> int:
        """The caller's last CPU at the first sample at or after ``t_ns`` (-1 unknown)."""
        s = self.by_tid.get(tid)
        if s is None:
            return -1
        j = int(np.searchsorted(s.t_ns, t_ns, side="left"))
        return int(s.cpu[j]) if j < s.t_ns.size else -1

    def peers(self, cpu: int, start_ns: int, end_ns: int, caller: int) -> tuple[str, bool]:
        """'tid/role' of candidate threads, and whether the samples could judge at all."""
        if cpu < 0 or not self.by_tid:
            return "", False
        found: list[str] = []
        judged = False
        for tid, s in self.by_tid.items():
            i = int(np.searchsorted(s.t_ns, start_ns, side="right")) - 1
            j = int(np.searchsorted(s.t_ns, end_ns, side="left"))
            if i < 0 or j >= s.t_ns.size:
                continue
            judged = True
            if tid == caller or s.run_ns[j] <= s.run_ns[i]:
                continue
            mask = self.masks.get(tid, frozenset())
            if mask and cpu not in mask:
                continue
            if cpu in (int(s.cpu[i]), int(s.cpu[j])) or mask == frozenset({cpu}):
                found.append(f"{tid}/{self.roles.get(tid, 'unknown')}")
        return ",".join(sorted(found)), judged


# The columns of a slow call that its attribution row is made from.
_SLOW_COLUMNS = (
    "rank",
    "tid",
    "name",
    "start_ns",
    "end_ns",
    "duration_ns",
    "baseline_ns",
    "baseline_source",
    "thread_cpu_ns",
    "voluntary",
    "involuntary",
    "ev_cpu",
)


def attribute_calls(
    calls: pd.DataFrame,
    evidence: pd.DataFrame | None,
    *,
    run: str,
    twin: pd.DataFrame | None = None,
    threads: pd.DataFrame | None = None,
    sched_samples: pd.DataFrame | None = None,
    rule: SlowCallRule | None = None,
) -> pd.DataFrame:
    """One row per slow runtime/sync call of one run, with its excess split (``CALL_COLUMNS``).

    ``calls`` and ``twin`` are ``events/cuda`` frames, ``evidence`` the run's
    ``events/cuda_sched`` (None or empty: every call is ``unknown``), ``threads`` and
    ``sched_samples`` its ``threads`` and ``samples/sched`` tables for roles and CPU peers.
    """
    rule = rule or SlowCallRule()
    if twin is None and rule.threshold_ns is None:
        raise ValueError(
            "attribute_calls: no isolation twin given, so 'slow' needs an absolute "
            "SlowCallRule(threshold_ns=...)"
        )
    slow = _slow_calls(calls, evidence, twin, rule)
    roles = _roles(threads)
    peers = CpuPeers(sched_samples, threads)
    rows = [
        _call_row(dict(zip(_SLOW_COLUMNS, values, strict=True)), run, roles, peers)
        for values in zip(*(slow[c].tolist() for c in _SLOW_COLUMNS), strict=True)
    ]
    return pd.DataFrame(rows, columns=list(CALL_COLUMNS))


def _slow_calls(
    calls: pd.DataFrame,
    evidence: pd.DataFrame | None,
    twin: pd.DataFrame | None,
    rule: SlowCallRule,
) -> pd.DataFrame:
    """The calls slower than ``rule`` allows, with their baseline and scheduling evidence
    (-1 where a call has none)."""
    api = _durations(calls).merge(baselines(calls, twin), on="name", how="left")
    if rule.threshold_ns is not None:
        slow = api[api["duration_ns"] > rule.threshold_ns]
    else:
        slow = api[api["duration_ns"] > rule.factor * api["baseline_ns"]]
    slow = slow.copy()
    if evidence is not None and not evidence.empty:
        ev = evidence[[*EVIDENCE_KEYS, "thread_cpu_ns", "voluntary", "involuntary"]].copy()
        at_exit, at_entry = evidence["cpu_exit"], evidence["cpu_entry"]
        ev["ev_cpu"] = np.where(at_exit >= 0, at_exit, at_entry)
        slow = slow.merge(ev, on=EVIDENCE_KEYS, how="left")
    for col in ("thread_cpu_ns", "voluntary", "involuntary", "ev_cpu"):
        slow[col] = slow[col].fillna(-1).astype(np.int64) if col in slow else -1
    return slow


def _call_row(
    r: dict[str, Any], run: str, roles: dict[tuple[int, int], str], peers: CpuPeers
) -> dict[str, Any]:
    """One slow call's attribution: its excess over the baseline, split by the evidence."""
    duration, baseline = int(r["duration_ns"]), round(float(r["baseline_ns"]))
    excess = max(0, duration - baseline)
    sp = split_excess(
        duration_ns=duration,
        excess_ns=excess,
        thread_cpu_ns=int(r["thread_cpu_ns"]),
        voluntary=int(r["voluntary"]),
        involuntary=int(r["involuntary"]),
    )
    rank, tid, start, end = int(r["rank"]), int(r["tid"]), int(r["start_ns"]), int(r["end_ns"])
    cpu = int(r["ev_cpu"]) if int(r["ev_cpu"]) >= 0 else peers.caller_cpu(tid, end)
    cpu_peers, known = peers.peers(cpu, start, end, tid)
    return {
        "run": run,
        "rank": rank,
        "tid": tid,
        "role": roles.get((rank, tid), "unknown"),
        "name": str(r["name"]),
        "start_ns": start,
        "duration_ns": duration,
        "baseline_ns": baseline,
        "baseline_source": str(r["baseline_source"]),
        "excess_ns": excess,
        "off_cpu_ns": sp.off_cpu_ns,
        "preempted_ns": sp.preempted_ns,
        "blocked_ns": sp.blocked_ns,
        "on_cpu_ns": sp.on_cpu_ns,
        "voluntary": int(r["voluntary"]),
        "involuntary": int(r["involuntary"]),
        "class": str(sp.cls),
        "cpu": cpu,
        "cpu_peers": cpu_peers,
        "peers_known": known,
    }


def attribute_trace(
    trace_path: Path, twin_path: Path | None = None, *, rule: SlowCallRule | None = None
) -> pd.DataFrame:
    """``attribute_calls`` for one rank's trace (and its twin's), measured steps only: warm-up
    holds the subscription, autotuning and first-touch allocations, which no twin repeats."""
    with open_trace(trace_path) as t:
        run = str(t.attrs["run_id"])
        cuda = _measured(t.table(Table.CUDA), int(t.attrs.get("warmup_steps", 0)))
        evidence = t.table(Table.CUDA_SCHED)
        threads, samples = t.table(Table.THREADS), t.table(Table.SCHED)
    twin = None
    if twin_path is not None:
        with open_trace(twin_path) as w:
            twin = _measured(w.table(Table.CUDA), int(w.attrs.get("warmup_steps", 0)))
    return attribute_calls(
        cuda, evidence, run=run, twin=twin, threads=threads, sched_samples=samples, rule=rule
    )


def _measured(cuda: pd.DataFrame, warmup: int) -> pd.DataFrame:
    return cuda[cuda["step"] >= warmup]


def summarize_calls(table: pd.DataFrame) -> pd.DataFrame:
    """Per run, thread role and class: slow calls, their total excess and its split (ns)."""
    keys = ["run", "role", "class"]
    if table.empty:
        return pd.DataFrame(columns=[*keys, "calls", "excess_ns", *PARTS])
    out = (
        table.groupby(keys, observed=True)
        .agg(
            calls=("excess_ns", "size"),
            excess_ns=("excess_ns", "sum"),
            preempted_ns=("preempted_ns", "sum"),
            blocked_ns=("blocked_ns", "sum"),
            on_cpu_ns=("on_cpu_ns", "sum"),
        )
        .reset_index()
    )
    return out
