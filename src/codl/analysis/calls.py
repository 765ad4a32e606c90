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
of run-queue wait.

With exact scheduler events (``trace.sched_events``: ``events/sched_switch`` and
``events/sched_waking``, ``codl.analysis.offcpu``) the split is exact instead (``source`` =
``sched_events``): preempted = the call's run-queue wait (runnable but not running, also after a
wake-up), blocked = the time it slept, each cut to the call; ``cpu_peers`` then names the task
that held the CPU longest while the call waited (or, for a block, its waker), and ``mixed`` is
not needed. Without them ``source`` is ``counters``.

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.trace.schema import Table
from codl.trace.store import Trace, open_trace

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
    "source",
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


def _checked(rule: SlowCallRule | None, twin: bool) -> SlowCallRule:
    """``rule`` (default: ``SlowCallRule()``), refused where it cannot judge a call without a
    twin."""
    rule = rule or SlowCallRule()
    if not twin and rule.threshold_ns is None:
        raise ValueError(
            "attribute_calls: no isolation twin given, so 'slow' needs an absolute "
            "SlowCallRule(threshold_ns=...)"
        )
    return rule


def attribute_calls(
    calls: pd.DataFrame,
    evidence: pd.DataFrame | None,
    *,
    run: str,
    twin: pd.DataFrame | None = None,
    threads: pd.DataFrame | None = None,
    sched_samples: pd.DataFrame | None = None,
    rule: SlowCallRule | None = None,
    sched_events: tuple[pd.DataFrame, pd.DataFrame] | None = None,
) -> pd.DataFrame:
    """One row per slow runtime/sync call of one run, with its excess split (``CALL_COLUMNS``).

    ``calls`` and ``twin`` are ``events/cuda`` frames, ``evidence`` the run's
    ``events/cuda_sched`` (None or empty: every call is ``unknown``), ``threads`` and
    ``sched_samples`` its ``threads`` and ``samples/sched`` tables for roles and CPU peers;
    ``sched_events`` its (``events/sched_switch``, ``events/sched_waking``) frames, which make
    the split exact (``exact_split``).
    """
    rule = _checked(rule, twin is not None)
    return _attributed(
        _slow_calls(calls, evidence, twin, rule),
        run=run,
        threads=threads,
        sched_samples=sched_samples,
        sched_events=sched_events,
    )


def _attributed(
    slow: pd.DataFrame,
    *,
    run: str,
    threads: pd.DataFrame | None,
    sched_samples: pd.DataFrame | None,
    sched_events: tuple[pd.DataFrame, pd.DataFrame] | None,
) -> pd.DataFrame:
    """The attribution rows (``CALL_COLUMNS``) of the slow calls ``slow`` (``_slow_calls``)."""
    roles = _roles(threads)
    peers = CpuPeers(sched_samples, threads)
    rows = [
        _call_row(dict(zip(_SLOW_COLUMNS, values, strict=True)), run, roles, peers)
        for values in zip(*(slow[c].tolist() for c in _SLOW_COLUMNS), strict=True)
    ]
    out = pd.DataFrame(rows, columns=list(CALL_COLUMNS))
    if sched_events is not None and not sched_events[0].empty and not out.empty:
        out = exact_split(out, sched_events[0], sched_events[1], roles)
    return out


def exact_split(
    slow: pd.DataFrame,
    switch: pd.DataFrame,
    waking: pd.DataFrame,
    roles: dict[tuple[int, int], str] | None = None,
) -> pd.DataFrame:
    """Replace the counter-based split of ``slow`` (``attribute_calls`` rows) with the exact one
    from scheduler events: off-CPU time counted first up to the excess, run-queue wait before
    sleep, the rest on CPU; the class is the largest part."""
    from codl.analysis.offcpu import offcpu_intervals, overlap_by_window

    roles = roles or {}
    iv = offcpu_intervals(switch, waking, tids=slow["tid"].unique())
    win = pd.DataFrame(
        {
            "tid": slow["tid"],
            "start_ns": slow["start_ns"],
            "end_ns": slow["start_ns"] + slow["duration_ns"],
            "window": np.arange(len(slow)),
        }
    )
    ov = overlap_by_window(iv, win)
    excess = slow["excess_ns"].to_numpy(np.int64)
    pre = np.minimum(ov["runnable_ns"].to_numpy(np.int64), excess)
    blk = np.minimum(ov["blocked_ns"].to_numpy(np.int64), excess - pre)
    on = excess - pre - blk
    out = slow.copy()
    out["off_cpu_ns"] = (ov["runnable_ns"] + ov["blocked_ns"]).to_numpy(np.int64)
    out["preempted_ns"], out["blocked_ns"], out["on_cpu_ns"] = pre, blk, on
    parts = np.stack([pre, blk, on])
    names = np.array([CallClass.PREEMPTED, CallClass.BLOCKED, CallClass.ON_CPU], dtype=object)
    out["class"] = np.where(excess > 0, names[parts.argmax(axis=0)], out["class"])
    who = np.where(pre >= blk, ov["preempted_by"], ov["waker_tid"])
    ranks = out["rank"].to_numpy(np.int64)
    out["cpu_peers"] = [
        f"{w}/{roles.get((int(r), int(w)), 'other')}" if w > 0 else ""
        for w, r in zip(who, ranks, strict=True)
    ]
    out["peers_known"] = True
    out["source"] = "sched_events"
    return out


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
    return _with_evidence(slow.copy(), evidence)


def _with_evidence(slow: pd.DataFrame, evidence: pd.DataFrame | None) -> pd.DataFrame:
    """``slow`` with each call's scheduling evidence (-1 where it has none)."""
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
        "source": "counters",
    }


def attribute_trace(
    trace_path: Path, twin_path: Path | None = None, *, rule: SlowCallRule | None = None
) -> pd.DataFrame:
    """``attribute_calls`` for one rank's trace (and its twin's), measured steps only: warm-up
    holds the subscription, autotuning and first-touch allocations, which no twin repeats.

    The same table, without reading either trace's calls whole (a long run makes ~10^8): each
    trace's events/cuda is read block by block (verified as it is read) into exact per-name
    medians (``_NameMedians``), then the run's once more for the calls over their limit, and
    its events/cuda_sched for those calls' evidence only. Memory grows with the slow calls
    and the distinct durations, not with the calls."""
    rule = _checked(rule, twin_path is not None)
    twin = None
    if twin_path is not None:
        with open_trace(twin_path) as w:
            twin = _medians(w)
    with open_trace(trace_path) as t:
        run = str(t.attrs["run_id"])
        base = _baseline_table(_medians(t), twin)
        found = _slow_rows(t, base, rule)
        slow = _with_evidence(found, _evidence_of(t, found))
        threads, samples = t.table(Table.THREADS), t.table(Table.SCHED)
        events = None
        if Table.SCHED_SWITCH in t.tables():
            events = (t.table(Table.SCHED_SWITCH), t.table(Table.SCHED_WAKING))
    return _attributed(slow, run=run, threads=threads, sched_samples=samples, sched_events=events)


# Rows a block of the streamed tables; per-name durations gathered before they are merged.
_BLOCK_ROWS: Final = 1 << 18
_MERGE_AT: Final = 1 << 21


class _NameMedians:
    """Exact medians of int64 durations per name code, added block by block: a count per
    distinct (code, duration), merged as they gather, so memory grows with the distinct
    durations (at most one per nanosecond of a name's range), not with the calls. The median is
    ``Series.median``'s: the middle value, or the mean of the middle two."""

    def __init__(self) -> None:
        self._codes = self._ns = self._counts = np.empty(0, np.int64)
        self._pending: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
        self._pending_n = 0

    def add(self, codes: npt.NDArray[Any], ns: npt.NDArray[np.int64]) -> None:
        if len(ns):
            self._pending.append((codes.astype(np.int64), ns.astype(np.int64)))
            self._pending_n += len(ns)
        if self._pending_n >= _MERGE_AT:
            self._merge()

    def _merge(self) -> None:
        codes = np.concatenate([self._codes, *(c for c, _ in self._pending)])
        ns = np.concatenate([self._ns, *(n for _, n in self._pending)])
        ones = [np.ones(len(n), np.int64) for _, n in self._pending]
        counts = np.concatenate([self._counts, *ones])
        self._pending, self._pending_n = [], 0
        order = np.lexsort((ns, codes))
        codes, ns, counts = codes[order], ns[order], counts[order]
        first = np.ones(len(ns), dtype=np.bool_)
        first[1:] = (codes[1:] != codes[:-1]) | (ns[1:] != ns[:-1])
        at = np.flatnonzero(first)
        self._codes, self._ns = codes[at], ns[at]
        self._counts = np.add.reduceat(counts, at) if len(at) else counts

    def medians(self) -> dict[int, float]:
        self._merge()
        edges = np.flatnonzero(np.diff(self._codes)) + 1
        out: dict[int, float] = {}
        for lo, hi in zip([0, *edges], [*edges, len(self._codes)], strict=True):
            if lo == hi:
                continue
            ns, upto = self._ns[lo:hi], np.cumsum(self._counts[lo:hi])
            n = int(upto[-1])
            # The values at 0-based positions (n - 1) // 2 and n // 2: the same one for odd n.
            a = ns[np.searchsorted(upto, (n - 1) // 2, side="right")]
            b = ns[np.searchsorted(upto, n // 2, side="right")]
            out[int(self._codes[lo])] = (float(a) + float(b)) / 2
        return out


def _api_blocks(t: Trace) -> Iterator[dict[str, npt.NDArray[Any]]]:
    """The measured API calls (``API_KINDS``, steps from ``warmup_steps``) of each block of
    ``t``'s events/cuda, verified as it is read."""
    warmup = int(t.attrs.get("warmup_steps", 0))
    kinds = [t.strings.index(k) for k in API_KINDS if k in t.strings]
    if Table.CUDA not in t.tables() or not kinds:
        return
    for _, _, block in t.verified_blocks(Table.CUDA, rows=_BLOCK_ROWS):
        keep = np.isin(block["kind"], kinds) & (block["step"] >= warmup)
        yield {c: v[keep] for c, v in block.items()}


def _medians(t: Trace) -> dict[str, float]:
    """p50 duration per API name of ``t``'s measured calls (``baselines``' per trace)."""
    m = _NameMedians()
    for block in _api_blocks(t):
        m.add(block["name"], block["end_ns"] - block["start_ns"])
    return {t.strings[code]: p50 for code, p50 in m.medians().items()}


def _baseline_table(own: dict[str, float], twin: dict[str, float] | None) -> pd.DataFrame:
    """``baselines`` from per-name medians: the twin's where it called that name."""
    names = list(own)
    theirs = twin or {}
    return pd.DataFrame(
        {
            "name": names,
            "baseline_ns": [theirs.get(n, own[n]) for n in names],
            "baseline_source": ["twin" if n in theirs else "self" for n in names],
        }
    )


def _slow_rows(t: Trace, base: pd.DataFrame, rule: SlowCallRule) -> pd.DataFrame:
    """The measured API calls of ``t`` over ``rule``'s limit against ``base``
    (``_baseline_table``), in the trace's order, with their duration and baseline: what
    ``_slow_calls`` selects before the evidence, made block by block."""
    code = {s: i for i, s in enumerate(t.strings)}
    limit = np.full(len(t.strings), np.inf)
    for name, p50 in zip(base["name"], base["baseline_ns"], strict=True):
        limit[code[name]] = (
            rule.threshold_ns if rule.threshold_ns is not None else rule.factor * p50
        )
    keep = ("rank", "tid", "name", "correlation", "start_ns", "end_ns")
    pieces: dict[str, list[npt.NDArray[Any]]] = {c: [] for c in (*keep, "duration_ns")}
    for block in _api_blocks(t):
        ns = (block["end_ns"] - block["start_ns"]).astype(np.int64)
        slow = ns > limit[block["name"]]
        for c in keep:
            pieces[c].append(block[c][slow])
        pieces["duration_ns"].append(ns[slow])
    cols = {c: np.concatenate(v) if v else np.empty(0, np.int64) for c, v in pieces.items()}
    names = np.asarray(t.strings, dtype=object)
    frame = pd.DataFrame({**cols, "name": names[cols["name"].astype(np.int64)].astype(str)})
    return frame.merge(base, on="name", how="left")


def _evidence_of(t: Trace, slow: pd.DataFrame) -> pd.DataFrame | None:
    """The rows of ``t``'s events/cuda_sched that ``slow``'s calls may match (by
    correlation), read block by block and verified; None without the table."""
    if Table.CUDA_SCHED not in t.tables():
        return None
    wanted = slow["correlation"].to_numpy(np.int64)
    pieces: list[pd.DataFrame] = []
    for _, _, block in t.verified_blocks(Table.CUDA_SCHED, rows=_BLOCK_ROWS):
        mine = np.isin(block["correlation"], wanted)
        if mine.any():
            pieces.append(pd.DataFrame({c: v[mine] for c, v in block.items()}))
    return pd.concat(pieces, ignore_index=True) if pieces else None


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
