"""Background load (codl.analysis.load): a real run with a CPU hog planted on its core is flagged,
a quiet run reads only what the rest of the machine takes of its core, and comparison rows
inherit the flag of their runs and twins.

The planted hog is strong (HOGS busy loops on the run's one core, at the run's own priority):
whatever else the machine runs, the scheduler gives the hogs at least HOGS / (HOGS + 1) of the
core while the run's thread wants it, so the hogged run reads far above the flag.

The quiet run is measured on its own core only, and against that core's ambient load: how busy
other processes keep it while the test sleeps, sampled from /proc/stat just before and just
after the run. On a quiet machine (CI) that is ~0 and the run must not be flagged; on a shared
one (this project's 2-core VM, load average 2-4) the run reads up to the ambient load, which is
real load, so there the test asserts that the reading does not exceed it (the measure invents no
load) rather than that it is 0. Of QUIET_TRIES runs the one closest to its ambient reading is
kept, so one burst of a neighbour inside a run does not fail the test. (Hogs moved to the other
core would not do as a quiet control: they push the machine's other tasks onto the run's core,
0.82 measured.)
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from codl.analysis import load
from codl.analysis.summarize import summarize_trace
from codl.harness.launch import launch
from codl.spec import RunSpec

HOGS = 3
QUIET_TRIES = 3
# Ambient load below this is a quiet machine; a reading may exceed its ambient load by the
# tick granularity and the load's drift between the samples and the run.
QUIET_AMBIENT = 0.05
AMBIENT_MARGIN = 0.15
ALLOWED = sorted(os.sched_getaffinity(0))


def _spec(repeat: int) -> RunSpec:
    return RunSpec.from_dict(
        {
            "mode": "compute",
            "device": "cpu",
            "workload": {"model": "resnet_tiny", "batch_size": 4, "image_size": 32},
            # ~1 s measured on one core: 100 ticks of /proc/stat, each 1 % of the share.
            "steps": {"warmup": 2, "measured": 30},
            # One CPU, the first of the allowed set (spec.PinningSpec): the one the hogs take.
            "pinning": {"policy": "none", "cpus": 1},
            "repeat": repeat,
        }
    )


@contextmanager
def hogs(cpu: int, n: int = HOGS) -> Iterator[None]:
    """``n`` busy-loop processes confined to ``cpu`` while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        for p in procs:
            os.sched_setaffinity(p.pid, {cpu})
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _measured(tmp_path: Path, name: str, repeat: int) -> pd.Series:
    trace = tmp_path / f"{name}.h5"
    launch(_spec(repeat), trace_path=trace, dataset_dir=None)
    _, summary, _ = summarize_trace(trace)
    return summary.iloc[0]


def _ambient(cpu: int, seconds: float = 0.5) -> float:
    """Fraction of ``cpu`` other processes kept busy over ``seconds`` while this one sleeps."""

    def ticks() -> tuple[int, int]:
        with open("/proc/stat") as f:
            line = next(x for x in f if x.startswith(f"cpu{cpu} "))
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, line.split()[1:9])
        busy = user + nice + system + irq + softirq + steal
        return busy, busy + idle + iowait

    b0, t0 = ticks()
    time.sleep(seconds)
    b1, t1 = ticks()
    return (b1 - b0) / max(1, t1 - t0)


def test_a_hog_on_the_runs_core_is_flagged_and_a_quiet_run_is_not(tmp_path: Path) -> None:
    cpu = ALLOWED[0]
    with hogs(cpu):
        hogged = _measured(tmp_path, "hogged", 0)
    # The hogs hold >= 3/4 of the run's core whenever its thread is runnable, all of it else.
    assert hogged[load.SHARE_COLUMN] >= 0.6, hogged[load.SHARE_COLUMN]
    assert bool(hogged[load.FLAG_COLUMN])
    tries = []
    for i in range(QUIET_TRIES):
        before = _ambient(cpu)
        row = _measured(tmp_path, f"quiet{i}", 1 + i)
        tries.append((row, max(before, _ambient(cpu))))
    quiet, ambient = min(tries, key=lambda t: float(t[0][load.SHARE_COLUMN]) - t[1])
    share = float(quiet[load.SHARE_COLUMN])
    assert share <= ambient + AMBIENT_MARGIN, (share, ambient)
    if ambient < QUIET_AMBIENT:
        assert not bool(quiet[load.FLAG_COLUMN]), (share, ambient)
    # A run's flag follows its share; the share is a fraction of the run's cores.
    for row in (hogged, quiet):
        assert 0.0 <= row[load.SHARE_COLUMN] <= 1.0
        assert bool(row[load.FLAG_COLUMN]) == (row[load.SHARE_COLUMN] >= load.OUTSIDE_LOAD_FLAG)


def test_comparison_rows_carry_the_flag_of_their_runs_and_twins() -> None:
    runs = pd.DataFrame(
        {
            "run_id": ["c1", "c2", "i1", "i2", "m1"],
            "mode": ["combined", "combined", "compute", "compute", "comm"],
            "step_ms_cv": [0.3, 0.3, 0.01, 0.6, 0.32],
            load.FLAG_COLUMN: [True, False, False, False, False],
        }
    )
    comparison = pd.DataFrame(
        {
            "runs": ["c1", "c2", "c2", "c2 c2", "c2"],
            "isolation_runs": ["i1", "i1", "i2", None, "m1"],
        }
    )
    got = load.flag_comparison(comparison, runs)[load.FLAG_COLUMN].tolist()
    # c1 loaded; c2 with a stable quiet twin; c2 with an unstable compute twin (CV 0.6); no
    # twin; an AllReduce twin, whose steps vary by nature (CV 0.32 on quiet H200 nodes).
    assert got == [True, False, True, False, False]
    # A combined run's own spread is the effect measured, not instability.
    assert load.unstable(runs).tolist() == [False, False, False, True, False]


def _core_samples(rng: np.random.Generator, ranks: int, steps: int, cores: int) -> pd.DataFrame:
    """samples/cpu of ``ranks`` ranks over steps -1..steps-1, each core's cumulative ticks; a
    few cores missing from a sample (offline), a few rows repeated (a sample read twice), the
    last rank's rows all in the warm-up, some samples tagged out of time order."""
    rows = []
    for rank in range(ranks):
        last = 1 if rank == ranks - 1 and ranks > 1 else steps
        ticks = rng.integers(0, 50, cores)
        for step in range(-1, last):
            t = 10**9 * (step + 2) + int(rng.integers(0, 1000))
            tag = step - 1 if rng.random() < 0.1 else step
            ticks = ticks + rng.integers(0, 20, cores)
            for cpu in range(cores):
                if rng.random() < 0.05:
                    continue
                row = {"t_ns": t, "rank": rank, "step": tag, "cpu": cpu, "user": ticks[cpu]}
                row |= {"system": ticks[cpu] // 3, "idle": 5, "iowait": 0, "other": step + 1}
                rows.extend([row] * (2 if rng.random() < 0.03 else 1))
    dtypes = {"rank": "int16", "step": "int32", "cpu": "int16", "t_ns": "int64"}
    return pd.DataFrame(rows).astype(dtypes)


def _share(
    cpu: pd.DataFrame,
    *,
    sched: pd.DataFrame,
    threads: pd.DataFrame,
    attrs: dict[str, str],
    warmup: int,
    per_node: int,
) -> dict[str, Any]:
    return load.outside_cpu_share(
        cpu, sched, threads, attrs, warmup=warmup, ranks_per_node=per_node
    )


def _random_case(rng: np.random.Generator) -> tuple[int, int, int, int, pd.DataFrame]:
    """(ranks, cores, warm-up, ranks per node, samples/cpu) of one random case."""
    ranks, cores = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    warmup, per_node = int(rng.integers(0, 4)), int(rng.integers(1, 4))
    return ranks, cores, warmup, per_node, _core_samples(rng, ranks, int(rng.integers(2, 9)), cores)


def _same_share(got: dict[str, Any], whole: dict[str, Any], case: int) -> bool:
    """Assert ``got`` is the whole table's share, to the bit; whether it is a number."""
    assert got[load.FLAG_COLUMN] == whole[load.FLAG_COLUMN], case
    pd.testing.assert_series_equal(pd.Series(got), pd.Series(whole), check_exact=True)
    return not np.isnan(whole[load.SHARE_COLUMN])


def test_the_core_samples_kept_give_the_share_of_the_whole_table() -> None:
    # read_summary keeps only the samples/cpu rows outside_cpu_share reads (a row per core,
    # rank and step is ~5 x 10^6 rows at 10^9 events), reduced block by block: the share must
    # be that of the whole table, whatever the cores, ranks per node, warm-up and block size.
    from codl.analysis.chunked import _CoreSamplePass

    rng = np.random.default_rng(7)
    numeric = 0
    for case in range(40):
        ranks, cores, warmup, per_node, cpu = _random_case(rng)
        masks = ["", f"0-{max(0, cores - 2)}", "1"]
        threads = pd.DataFrame(
            {
                "rank": np.arange(ranks),
                "tid": 100 + np.arange(ranks),
                "cpus_actual": [masks[int(rng.integers(0, 3))] for _ in range(ranks)],
            }
        )
        steps = sorted(set(cpu["step"]))
        sched = pd.DataFrame(
            [
                {"rank": r, "step": s, "tid": 100 + r, "run_ns": (s + 2) * int(3e8)}
                for r in range(ranks)
                for s in steps
            ]
        )
        share = functools.partial(
            _share,
            sched=sched,
            threads=threads,
            attrs={"allowed_cpus": f"0-{cores - 1}"},
            warmup=warmup,
            per_node=per_node,
        )

        whole = share(cpu)
        reduced = cpu[load.core_sample_rows(cpu, warmup=warmup)]
        blocks = _CoreSamplePass(warmup)
        size = int(rng.integers(1, 40))
        for lo in range(0, len(cpu), size):
            blocks.add({c: cpu[c].to_numpy()[lo : lo + size] for c in cpu})
        streamed = blocks.result()
        pd.testing.assert_frame_equal(streamed, reduced.reset_index(drop=True), check_dtype=False)
        numeric += _same_share(share(reduced), whole, case)
        assert len(reduced) < len(cpu) or len(cpu) <= 4 * ranks * cores
    assert numeric >= 20


def test_the_thread_samples_kept_give_the_share_of_the_whole_table() -> None:
    # summarize_to keeps of samples/sched (~4 x 10^6 rows at 10^9 events) only the rows
    # outside_cpu_share reads once the per-step deltas are made: the share must be the whole
    # table's, whatever the threads (TIDs shared across ranks, threads that come and go, a
    # reused TID whose counter starts again), ranks per node, warm-up and cores.
    rng = np.random.default_rng(13)
    numeric = 0
    for case in range(40):
        ranks, cores, warmup, per_node, cpu = _random_case(rng)
        threads = pd.DataFrame(
            {"rank": np.arange(ranks), "tid": 100 + np.arange(ranks), "cpus_actual": ""}
        )
        rows = []
        for rank in range(ranks):
            for tid in rng.choice([100, 101, 102, 103], size=int(rng.integers(1, 4))):
                run = int(rng.integers(0, 10**9))
                for step in range(-1, int(cpu["step"].max()) + 3):
                    if rng.random() < 0.2:  # not sampled: came late, left early, or a gap
                        continue
                    run = 0 if rng.random() < 0.05 else run + int(rng.integers(0, 4 * 10**8))
                    rows.append({"rank": rank, "step": step, "tid": int(tid), "run_ns": run})
        sched = pd.DataFrame(rows, columns=["rank", "step", "tid", "run_ns"])
        attrs = {"allowed_cpus": f"0-{cores - 1}"}
        share = functools.partial(
            _share, threads=threads, attrs=attrs, warmup=warmup, per_node=per_node
        )
        keep = load.sched_sample_rows(
            cpu, sched, threads, attrs, warmup=warmup, ranks_per_node=per_node
        )
        numeric += _same_share(share(cpu, sched=sched[keep]), share(cpu, sched=sched), case)
        assert keep.sum() < len(sched) or len(sched) <= 4 * ranks
    assert numeric >= 20
    # Samples only of the warm-up: none in the window, and the share counts no thread time;
    # the table is not empty for all that (an empty one means no samples: no share).
    cpu = _core_samples(np.random.default_rng(3), 1, 8, 2)
    threads = pd.DataFrame({"rank": [0], "tid": [100], "cpus_actual": [""]})
    early = pd.DataFrame({"rank": [0, 0], "step": [-1, 0], "tid": [100, 100], "run_ns": [0, 9]})
    share = functools.partial(
        _share, threads=threads, attrs={"allowed_cpus": "0-1"}, warmup=4, per_node=1
    )
    keep = load.sched_sample_rows(
        cpu, early, threads, {"allowed_cpus": "0-1"}, warmup=4, ranks_per_node=1
    )
    assert not np.isnan(share(cpu, sched=early)[load.SHARE_COLUMN])
    assert share(cpu, sched=early[keep]) == share(cpu, sched=early)
