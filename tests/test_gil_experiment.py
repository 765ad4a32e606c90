"""The block design of scripts/gil_experiment.py and the per-block pairing its results are
stated on, now codl.analysis.pooled's (the `pooled` rule's). The run order (``interleaved``,
``setting``) and py-spy's GIL holders are the script's alone, retired with it."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

from codl.analysis import pooled
from codl.config import build_plan
from codl.spec import RunSpec

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gil_experiment.py"


@pytest.fixture(scope="module")
def gil() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gil_experiment", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plan(repeats: int) -> list[RunSpec]:
    cfg = {
        "experiments": [
            {
                "name": "x",
                "factors": {
                    "mode": ["compute", "data+compute"],
                    "runtime.switch_interval_ms": [1, 20],
                },
                "repeats": repeats,
            },
            {
                "name": "fs",
                "base": {
                    "runtime": {"switch_interval_ms": 1},
                    "loader": {"sharing_strategy": "file_system"},
                },
                "factors": {"mode": ["data+compute"]},
                "repeats": repeats,
            },
        ]
    }
    return list(build_plan(cfg).specs.values())


def test_blocks_hold_every_run_beside_its_twin_in_abba_order(gil: ModuleType) -> None:
    specs = _plan(repeats=2)
    order = gil.interleaved(specs)
    assert sorted(s.run_id for s in order) == sorted(s.run_id for s in specs)
    assert [s.repeat for s in order] == sorted(s.repeat for s in order)  # block after block
    position = {s.run_id: i for i, s in enumerate(order)}
    for s in order:
        if s.mode.loads:
            twin = pooled.twin_id(s)
            assert twin in position
            assert next(t for t in specs if t.run_id == twin).repeat == s.repeat  # same block
    first = [s for s in order if s.repeat == 0]
    second = [s for s in order if s.repeat == 1]
    assert not first[0].mode.loads and second[0].mode.loads  # twin first, then loaded first
    assert gil.setting(first[1]) != gil.setting(second[0])  # settings rotate between blocks


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


def test_the_gil_holders_are_counted_per_thread_and_frame(gil: ModuleType) -> None:
    raw = "\n".join(
        [
            "thread (12): Thread-1 (_pin_memory_loop);do_one_step (pin_memory.py:39);"
            "munmap (libc.so.6) 30",
            "thread (11): MainThread;forward (module.py:1) 60",
            "thread (12): Thread-1 (_pin_memory_loop);get (queues.py:122) 10",
        ]
    )
    t = gil.gil_holders(raw)
    assert t.groupby("thread")["share"].sum().to_dict() == pytest.approx(
        {"Thread-1 (_pin_memory_loop)": 0.4, "MainThread": 0.6}
    )
    top_pin = t[t["thread"].str.contains("pin")].iloc[0]
    assert top_pin["native_leaf"] == "munmap (libc.so.6)" and top_pin["samples"] == 30
    assert gil.gil_holders("py-spy failed (1):\nPermission denied").empty


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
