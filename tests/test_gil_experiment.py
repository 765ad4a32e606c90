"""scripts/gil_experiment.py: the block design and the per-block pairing it states results on."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

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
            twin = gil.twin_id(s)
            assert twin in position
            assert next(t for t in specs if t.run_id == twin).repeat == s.repeat  # same block
    first = [s for s in order if s.repeat == 0]
    second = [s for s in order if s.repeat == 1]
    assert not first[0].mode.loads and second[0].mode.loads  # twin first, then loaded first
    assert gil.setting(first[1]) != gil.setting(second[0])  # settings rotate between blocks


def test_inflation_pairs_runs_inside_their_block(gil: ModuleType) -> None:
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
    t = gil.inflation(pd.DataFrame(rows))
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
