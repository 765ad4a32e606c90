"""The GIL experiment's reduction, as the workflow makes it (the `pooled` rule,
codl.analysis.pooled): the per-block pairing its results are stated on, the ring against the best
torch setting of its block, and the intervention figure. Its run order is the workflow's blocks
(tests/test_config_blocks.py), its per-run table the `launch_sleeps` rule's
(tests/test_gil_workflow.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from codl.analysis import pooled


def test_inflation_pairs_runs_inside_their_block() -> None:
    rows = []
    for rep, (twin, loaded) in enumerate([(10.0, 12.0), (20.0, 26.0), (10.0, 12.5)]):
        common = {"policy": "none", "switch_interval_ms": 5.0, "sharing_strategy": "fd"}
        common |= {"pin_memory": True, "pin_memory_place": "own", "repeat": rep}
        rows.append(
            {
                **common,
                "run_id": f"t{rep}",
                "mode": "compute",
                "twin_id": "",
                "compute_eff_ms_mean": twin,
            }
        )
        rows.append(
            {
                **common,
                "run_id": f"l{rep}",
                "mode": "data+compute",
                "twin_id": f"t{rep}",
                "compute_eff_ms_mean": loaded,
                "gil_wait_ms_per_step": 12.0,
                "throughput_samples_s": 100.0,
                "timer_sleep_ms_p50": 5.0,
                "timer_sleeps_per_step": 2.0,
                "timer_sleep_ms_per_step": 10.0,
                "pin_memory_sleep_ms_per_step": 2.0,
            }
        )
    t = pooled.inflation(pd.DataFrame(rows))
    assert len(t) == 1 and t["n_blocks"].iloc[0] == 3 and t["n_runs"].iloc[0] == 6
    # Block 2's twin is twice as slow: paired in its block, its ratio is 1.3, not 2.6.
    assert t["inflation"].iloc[0] == pytest.approx(
        math.exp(sum(map(math.log, [1.2, 1.3, 1.25])) / 3) - 1
    )
    assert t["inflation_lo"].iloc[0] < t["inflation"].iloc[0] < t["inflation_hi"].iloc[0]


def _handoff_runs() -> pd.DataFrame:
    """Two blocks, torch under two policies and the ring under one, planted throughputs."""
    rows = []
    planted = {  # (repeat, handoff, policy) -> samples/s
        (0, "torch", "none"): 3000.0,
        (0, "torch", "isolated-main"): 3200.0,
        (0, "ring", "none"): 4000.0,
        (1, "torch", "none"): 2500.0,
        (1, "torch", "isolated-main"): 2000.0,
        (1, "ring", "none"): 3000.0,
    }
    for (rep, handoff, policy), thr in planted.items():
        rows.append(
            {
                "run_id": f"{rep}{handoff}{policy}",
                "mode": "data+compute",
                "policy": policy,
                "handoff": handoff,
                "workers": 12,
                "repeat": rep,
                "source": 0,
                "throughput_samples_s": thr,
            }
        )
    # A torch run with other workers in block 0 must not be the ring's comparison.
    rows.append({**rows[1], "run_id": "w24", "workers": 24, "throughput_samples_s": 9e9})
    return pd.DataFrame(rows)


def test_the_ring_is_compared_with_the_best_torch_setting_of_its_block() -> None:
    out = pooled.throughput_versus_torch(_handoff_runs())
    row = out.iloc[0]
    assert (row["policy"], row["workers"], row["n_blocks"]) == ("none", 12, 2)
    # Block 0: 4000 / max(3000, 3200); block 1: 3000 / max(2500, 2000); geometric mean.
    assert row["ring_over_best_torch"] == pytest.approx(math.sqrt(4000 / 3200 * 3000 / 2500))
    assert row["lo"] < row["ring_over_best_torch"] < row["hi"]


def test_the_intervention_figure_shows_every_block_and_the_host_blocked_part(
    tmp_path: Path,
) -> None:
    from codl.figures.intervention import draw_intervention, host_blocked, inflation_points

    pooled = pd.DataFrame(
        [
            {
                "handoff": "torch",
                "policy": "none",
                "workers": 12,
                "pin_memory_place": "own",
                "per_block": "+20.0 +30.0 +40.0",
                "inflation": 0.3,
                "inflation_lo": 0.1,
                "inflation_hi": 0.5,
                "n_blocks": 3,
            },
            {
                "handoff": "ring",
                "policy": "none",
                "workers": 12,
                "pin_memory_place": "own",
                "per_block": "-1.0 +1.0 +0.5",
                "inflation": 0.002,
                "inflation_lo": -0.02,
                "inflation_hi": 0.03,
                "n_blocks": 3,
            },
        ]
    )
    points = inflation_points(pooled)
    assert len(points) == 6
    assert sorted(points[points["handoff"] == "torch"]["block_pct"]) == [20.0, 30.0, 40.0]
    runs = pd.DataFrame(
        {
            "run_id": ["a", "b", "c", "d"],
            "handoff": ["torch", "torch", "ring", "ring"],
            "policy": "none",
            "workers": 12,
            "pin_memory_place": "own",
        }
    )
    decomposition = pd.DataFrame(
        {
            "run_id": ["a", "a", "b", "c", "d", "d"],
            "outlier": [False, True, False, False, False, False],
            # The outlier step (100 ms) is left out: run a's mean is 8, run b's 12.
            "host_blocked_ms": [8.0, 100.0, 12.0, 0.0, 0.0, 0.0],
        }
    )
    blocked = host_blocked(decomposition, runs).set_index("handoff")
    assert blocked.loc["torch", "host_blocked_ms"] == pytest.approx(10.0)
    assert blocked.loc["torch", "n_runs"] == 2
    assert blocked.loc["ring", "host_blocked_ms"] == 0.0
    png = tmp_path / "f.png"
    draw_intervention(points, blocked.reset_index(), [png])
    assert png.stat().st_size > 10_000


REPO = Path(__file__).resolve().parents[1]
# Every committed pair but those written before the runs table named each run's twin
# (`twin_id`; results/gil-h200/pilot), which the pairing reads.
COMMITTED = sorted(
    p.parent
    for p in (REPO / "results").rglob("gil_inflation.csv")
    if "twin_id" in pd.read_csv(p.with_name("gil_runs.csv"), nrows=0).columns
)


@pytest.mark.parametrize("results", COMMITTED, ids=lambda p: str(p.relative_to(REPO)))
def test_the_pooled_inflation_of_a_committed_gil_runs_table_is_its_gil_inflation(
    results: Path,
) -> None:
    """The retired script's gil_inflation.csv is the `pooled` rule's pooled_inflation.csv: made
    again from the same gil_runs.csv, every committed column holds the same numbers."""
    want = pd.read_csv(results / "gil_inflation.csv")
    got = pooled.inflation(pd.read_csv(results / "gil_runs.csv"))
    assert set(want.columns) <= set(got.columns)
    keys = [k for k in pooled.KNOBS if k in want]
    for t in (want, got):
        if "pin_memory" in t:  # bool in one table, read back as text in an older one
            t["pin_memory"] = t["pin_memory"].astype(str)
    both = want.merge(got[list(want.columns)], on=keys, suffixes=("", "_got"), validate="1:1")
    assert len(both) == len(want) == len(got)
    for col in (c for c in want.columns if c not in keys):
        a, b = both[col], both[f"{col}_got"]
        if not pd.api.types.is_numeric_dtype(b):  # an empty text cell reads back as NaN
            a, b = a.fillna("").astype(str), b.fillna("").astype(str)
        pd.testing.assert_series_equal(a, b, check_names=False, check_dtype=False, rtol=1e-9)
