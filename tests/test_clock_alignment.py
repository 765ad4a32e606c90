"""Ranks on one clock: the NTP-style offset estimate, its bound, and a planted clock skew.

The pure parts run on synthetic stamps with a planted offset and random one-way delays. The
planted-skew test runs two real gloo ranks on CPU, rank 1 in a time namespace whose
CLOCK_MONOTONIC is shifted by a known amount (``unshare --time --monotonic``): the merge must
recover the shift within the bound it reports, and the peer-wait decomposition must not move by
more than that bound against the same trace aligned with the exact planted shift.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from codl.analysis import decompose as dec
from codl.analysis.inspect import describe, render
from codl.spec import RunSpec
from codl.trace.clock import (
    TIME_COLUMNS,
    Alignment,
    ClockSample,
    alignment_of,
    best_sample,
    rank_bounds,
)
from codl.trace.store import open_trace
from codl.trace.store.merge import merge_rank_traces

US = 1_000


def stamps(offset: int, rounds: int, rng: np.random.Generator) -> list[tuple[int, int, int, int]]:
    """(t0, t1, t2, t3) of ``rounds`` exchanges with asymmetric random delays; rank r's clock
    reads rank 0's plus ``offset``."""
    out = []
    t = 5_000_000_000
    for _ in range(rounds):
        there, back = rng.integers(20 * US, 400 * US, size=2)
        turn = int(rng.integers(1 * US, 5 * US))
        t0 = t + offset
        t1 = t + int(there)
        t2 = t1 + turn
        t3 = t2 + int(back) + offset
        out.append((t0, t1, t2, t3))
        t += 1_000 * US
    return out


@pytest.mark.parametrize("offset", [0, 7, -3_000_000_000, 123_456_789_012])
def test_the_estimate_is_within_its_bound_and_the_bound_is_half_the_best_round_trip(
    offset: int,
) -> None:
    rng = np.random.default_rng(abs(offset) % 1000)
    s = stamps(offset, 64, rng)
    est = best_sample(s, granularity_ns=1)
    assert abs(est.offset_ns - offset) <= est.bound_ns
    best = min((t3 - t0) - (t2 - t1) for t0, t1, t2, t3 in s)
    assert est.bound_ns == (best + 1) // 2 + 1
    assert est.rounds == 64


def test_the_bound_is_tight_when_one_way_delays_are_symmetric() -> None:
    # Equal delays both ways: the midpoint is exact, the bound still covers the worst case.
    s = [(t + 9, t + 50, t + 52, t + 111) for t in range(0, 10_000, 1_000)]
    est = best_sample(s, granularity_ns=1)
    assert est.offset_ns == 9
    assert est.bound_ns == 51


def test_no_rounds_is_an_error() -> None:
    with pytest.raises(ValueError, match="no clock exchange"):
        best_sample([], granularity_ns=1)


def sample(offset: int, at: int, bound: int = 10 * US) -> ClockSample:
    return ClockSample(offset_ns=offset, bound_ns=bound, at_ns=at, rtt_ns=2 * bound, rounds=64)


def test_drift_between_start_and_end_is_interpolated() -> None:
    # +1 ms at t=0, +1.1 ms 100 s later: 1000 ppb; half-way the offset is +1.05 ms.
    a = Alignment(
        rank=1, same_clock=False, start=sample(1_000_000, 0), end=sample(1_100_000, 10**11)
    )
    assert a.drift_ppb == pytest.approx(1000.0)
    t = np.array([0, 5 * 10**10, 10**11], dtype=np.int64)
    assert a.offset_at(t).tolist() == [1_000_000, 1_050_000, 1_100_000]
    assert a.bound_ns == 10 * US
    back = Alignment.from_dict(a.as_dict())
    assert back == a


def test_a_rank_on_rank_0s_clock_gets_exactly_zero_whatever_was_measured() -> None:
    sync = {"clock_id": "boot-a time:[1]", "start": sample(37 * US, 0).as_dict()}
    same = alignment_of(1, sync, "boot-a time:[1]")
    other = alignment_of(1, sync, "boot-b time:[1]")
    t = np.array([10**9], dtype=np.int64)
    assert same.same_clock and same.offset_at(t).tolist() == [0] and same.bound_ns == 0
    assert not other.same_clock and other.offset_at(t).tolist() == [37 * US]
    unmeasured = alignment_of(1, {"clock_id": "boot-b time:[1]"}, "boot-a time:[1]")
    assert not unmeasured.measured and unmeasured.bound_ns == -1
    assert unmeasured.offset_at(t).tolist() == [0]


def test_cross_node_peer_wait_needs_the_measured_bounds() -> None:
    # Two nodes, one rank each; rank 1 arrives 3 ms late at every bucket of 5 ms.
    ms = 1_000_000
    rows = []
    for step in range(2):
        for bucket in range(2):
            t = 10**12 + step * 100 * ms + bucket * 10 * ms
            rows.append((0, step, bucket, t, t + 5 * ms))
            rows.append((1, step, bucket, t + 3 * ms, t + 5 * ms))
    comm = pd.DataFrame(rows, columns=["rank", "step", "bucket", "start_ns", "end_ns"])
    comm = comm.assign(op="allreduce", bytes=4, gpu_ns=-1)
    unaligned = dec.comm_parts(comm, warmup=0, ranks_per_node=1)
    assert unaligned["peer_wait_ms"].isna().all()
    aligned = dec.comm_parts(comm, warmup=0, ranks_per_node=1, clock_bound_ns={0: 0, 1: 20 * US})
    r0 = aligned[aligned["rank"] == 0]
    # Rank 0 waits 3 ms at each of its 2 buckets; only the wait after its own last bucket is
    # exposed (lengthens its step): the per-bucket sum is the AllReduce's view.
    assert r0["bucket_peer_wait_ms"].tolist() == pytest.approx([6.0, 6.0])
    assert r0["peer_wait_ms"].tolist() == pytest.approx([3.0, 3.0])
    # Two buckets per step, each wait (rank 0 against rank 1 or back) off by at most rank 1's
    # bound; with a third rank of bound 50 us, the wait of each rank is off by its own bound
    # plus the largest of the others'.
    assert aligned["peer_wait_bound_ms"].tolist() == pytest.approx([0.04] * 4)
    three = pd.concat([comm, comm[comm["rank"] == 1].assign(rank=2)], ignore_index=True)
    bounds = {0: 0, 1: 20 * US, 2: 50 * US}
    parts = dec.comm_parts(three, warmup=0, ranks_per_node=1, clock_bound_ns=bounds)
    per_rank = parts.groupby("rank")["peer_wait_bound_ms"].first().to_dict()
    assert per_rank == pytest.approx({0: 0.1, 1: 0.14, 2: 0.14})


# --- planted skew: two real ranks, one in a shifted time namespace --------------------------

PLANTED_S = 5
RANK_SCRIPT = """
import json
import sys
from pathlib import Path
from codl.harness.runner import RankEnv, execute
from codl.trace.store.merge import rank_trace_path
from codl.spec import RunSpec
spec = RunSpec.from_dict(json.loads(Path(sys.argv[1]).read_text()))
rank, port, trace = int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
env = RankEnv(rank=rank, local_rank=0, world_size=2, local_world_size=1, master_port=port)
execute(spec, trace_path=rank_trace_path(trace, rank), dataset_dir=None, env=env)
"""


def _can_shift_time() -> str | None:
    if shutil.which("unshare") is None:
        return "util-linux unshare not found"
    probe = subprocess.run(
        ["unshare", "--time", "--monotonic", "1", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot create a time namespace here: {probe.stderr.strip()}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_node_spec() -> RunSpec:
    return RunSpec.from_dict(
        {
            "mode": "compute+comm",
            "workload": {"batch_size": 4, "image_size": 32},
            "layout": {"nodes": 2, "ranks_per_node": 1},
            "steps": {"warmup": 1, "measured": 4},
        }
    )


def run_skewed(tmp_path: Path) -> tuple[Path, RunSpec]:
    spec = two_node_spec()
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec.to_dict()))
    trace = tmp_path / "trace.h5"
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    base = [sys.executable, "-c", RANK_SCRIPT, str(spec_file)]
    shift = ["unshare", "--time", "--monotonic", str(PLANTED_S)]
    procs = [
        subprocess.Popen([*base, "0", port, str(trace)], env=env),
        subprocess.Popen([*shift, *base, "1", port, str(trace)], env=env),
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    merge_rank_traces(trace, 2, run_id=spec.run_id)
    return trace, spec


def tables_of(trace: Path) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    with open_trace(trace) as t:
        names = ("events/app", "events/comm", "events/cuda", "samples/sched", "threads")
        return {n: t.table(n) for n in names}, t.attrs


def shifted(tables: dict[str, pd.DataFrame], rank: int, by: int) -> dict[str, pd.DataFrame]:
    out = {}
    for name, frame in tables.items():
        df = frame.copy()
        mine = df["rank"] == rank
        for c in TIME_COLUMNS & set(df.columns):
            df.loc[mine, c] = df.loc[mine, c] + by
        out[name] = df
    return out


@pytest.mark.slow
def test_planted_clock_skew_is_recovered_within_the_bound(tmp_path: Path) -> None:
    reason = _can_shift_time()
    if reason:
        pytest.skip(reason)
    trace, spec = run_skewed(tmp_path)
    tables, attrs = tables_of(trace)
    r1 = Alignment.from_dict(attrs["clock_alignment"]["ranks"][1])
    planted = PLANTED_S * 10**9
    assert not r1.same_clock
    assert r1.start is not None and r1.end is not None
    for s in (r1.start, r1.end):
        assert abs(s.offset_ns - planted) <= s.bound_ns, (s, planted)
    # Both ranks share one physical clock: the measured drift is noise within the bounds.
    span = r1.end.at_ns - r1.start.at_ns
    assert abs(r1.drift_ppb) * span / 1e9 <= r1.start.bound_ns + r1.end.bound_ns
    bounds = rank_bounds(attrs)
    assert bounds is not None and bounds[1] == r1.bound_ns > 0 and bounds[0] == 0
    # The merged trace is on rank 0's clock: the ranks' step spans interleave.
    app = tables["events/app"]
    steps = app[app["phase"].astype(str) == "step"]
    starts = steps.groupby("rank")["start_ns"].min()
    # (a tenth of the skew: the ranks start their first step apart by their own start-up,
    # tens of ms on a loaded machine, and unaligned they would be the whole skew apart)
    assert abs(int(starts[1]) - int(starts[0])) < planted // 10
    # The same trace aligned with the exact planted shift instead of the measured one.
    error = r1.offset_ns - planted
    exact = shifted(tables, 1, error)
    warm = spec.steps.warmup
    got = dec.step_parts(tables, warmup=warm, ranks_per_node=1, clock_bound_ns=bounds)
    want = dec.step_parts(exact, warmup=warm, ranks_per_node=1, clock_bound_ns={0: 0, 1: 0})
    assert got["peer_wait_ms"].notna().all() and len(got) == 2 * spec.steps.measured
    diff = (got["peer_wait_ms"] - want["peer_wait_ms"]).abs()
    assert (diff <= got["peer_wait_bound_ms"] + 1e-9).all()
    # Without alignment the skew would have gone straight into the peer wait.
    raw = shifted(tables, 1, r1.offset_ns)
    skewed = dec.step_parts(raw, warmup=warm, ranks_per_node=1, clock_bound_ns={0: 0, 1: 0})
    assert (skewed["peer_wait_ms"] - want["peer_wait_ms"]).abs().max() > 10 * diff.max()
    text = render(describe(trace))
    assert f"within +-{r1.bound_ns} ns" in text and "1 rank(s) on another clock" in text
    print(
        f"planted {planted} ns, measured {r1.start.offset_ns} / {r1.end.offset_ns} ns, "
        f"bounds {r1.start.bound_ns} / {r1.end.bound_ns} ns"
    )
