"""The `slow_calls` rule's step: which runs are attributed (those with the calls' evidence, each
against its analysed compute twin) and the table it writes from traces with planted slow calls
(tests/test_calls.py's), the same as codl.analysis.calls gives one run at a time."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from codl.analysis import calls
from codl.config import build_plan
from codl.paths import ResultPaths
from codl.spec import Mode
from codl.steps.slow_calls import slow_calls_to
from codl.steps.workflow import slow_call_twins, slow_calls_targets
from test_calls import PLANTED, THREADS, synthetic_run, write_trace

CONFIG = {
    "defaults": {"device": "cuda", "trace": {"cuda_api": True, "cuda_api_sched": True}},
    "experiments": [
        {"name": "x", "factors": {"mode": ["compute", "data+compute", "data", "combined"]}},
        # Without the evidence: nothing to attribute.
        {
            "name": "plain",
            "base": {"loader": {"workers": 4}, "trace": {"cuda_api_sched": False}},
            "factors": {"mode": ["compute", "data+compute"]},
        },
    ],
}


def test_each_run_with_the_evidence_is_paired_with_its_analysed_compute_twin(
    caplog: pytest.LogCaptureFixture,
) -> None:
    specs = build_plan(CONFIG).specs
    by_mode = {
        s.mode: rid for rid, s in specs.items() if s.trace.cuda_api_sched and s.loader.workers != 4
    }
    with caplog.at_level(logging.WARNING):
        twins = slow_call_twins(specs, list(specs))
    # data alone computes nothing; compute+comm (combined's twin) is not planned: said so.
    assert twins == {by_mode[Mode.DATA_COMPUTE]: by_mode[Mode.COMPUTE]}
    assert f"run {by_mode[Mode.COMBINED]}: its compute twin" in caplog.text
    assert slow_call_twins(specs, [by_mode[Mode.DATA_COMPUTE]]) == {}  # twin not analysed
    paths = ResultPaths(Path("w"), set_name="x")
    assert slow_calls_targets(paths, twins) == [str(paths.slow_calls_table)]
    assert slow_calls_targets(paths, {}) == []


def test_the_table_holds_every_runs_slow_calls_as_attributed_one_by_one(tmp_path: Path) -> None:
    run, evidence, twin = synthetic_run(np.random.default_rng(5))
    run["step"], twin["step"] = 1, 1  # measured steps (warm-up: 1)
    tables = {"events/cuda": run, "events/cuda_sched": evidence, "threads": THREADS.assign(rank=1)}
    traces = [write_trace(tmp_path / f"run {i} ü.h5", f"r{i}", tables) for i in range(2)]
    twin_path = write_trace(tmp_path / "twin.h5", "t", {"events/cuda": twin})
    table = tmp_path / "tables" / "slow_calls.csv.gz"
    got = slow_calls_to(traces=traces, twins=[twin_path, twin_path], table=table)
    assert len(got) == 2 * len(PLANTED) and sorted(set(got["run"])) == ["r0", "r1"]
    written = pd.read_csv(table)  # gzip, from the name
    assert list(written.columns) == list(calls.CALL_COLUMNS) and len(written) == len(got)
    one = calls.attribute_trace(traces[0], twin_path)
    cols = ["start_ns", "excess_ns", "preempted_ns", "blocked_ns", "on_cpu_ns", "class"]
    pd.testing.assert_frame_equal(
        got[got["run"] == "r0"][cols].reset_index(drop=True), one[cols].reset_index(drop=True)
    )
    with pytest.raises(ValueError, match="one twin per run"):
        slow_calls_to(traces=traces, twins=[twin_path], table=table)
