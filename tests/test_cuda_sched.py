"""`trace.cuda_api_sched` on a real GPU (skipped without one): every call of the callback level
gets its scheduling evidence, row for row, and the per-call attribution reads the trace."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from codl.analysis import calls
from codl.datasets import generate
from codl.spec import DatasetSpec, RunSpec
from codl.trace.store import open_trace
from test_cuda import run_in_fresh_process

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_every_callback_call_has_its_scheduling_evidence(tmp_path: Path) -> None:
    dataset = tmp_path / "jpeg"
    generate(DatasetSpec(samples=256, height=120, width=160), dataset)
    spec = RunSpec.from_dict(
        {
            "mode": "data+compute",
            "device": "cuda",
            "workload": {"model": "resnet18", "batch_size": 32, "image_size": 96},
            "dataset": {"samples": 256, "height": 120, "width": 160},
            "loader": {"workers": 4, "pin_memory": True},
            "steps": {"warmup": 3, "measured": 6},
            "trace": {"cuda_api": True, "cuda_api_sched": True},
        }
    )
    trace = run_in_fresh_process(spec, tmp_path, dataset)
    with open_trace(trace) as t:
        cuda = t.table("events/cuda")
        ev = t.table("events/cuda_sched")
        assert t.attrs["cuda_api_sched"] == "on"
    assert len(ev) == len(cuda) > 0
    for key in ("tid", "correlation", "start_ns", "end_ns"):
        assert (ev[key].to_numpy() == cuda[key].to_numpy()).all(), key
    measured = ev["thread_cpu_ns"] >= 0
    assert measured.mean() > 0.99  # only calls nested > 8 deep go without
    ok = ev[measured]
    dur = (ok["end_ns"] - ok["start_ns"]).to_numpy()
    assert (ok["thread_cpu_ns"].to_numpy() <= dur + 1_000_000).all()
    assert (ok["voluntary"] >= 0).all() and (ok["involuntary"] >= 0).all()
    allowed = os.sched_getaffinity(0)
    assert set(ok["cpu_entry"].tolist()) <= allowed and set(ok["cpu_exit"].tolist()) <= allowed
    # Calls that did not switch were on CPU throughout.
    still = ok[(ok["voluntary"] == 0) & (ok["involuntary"] == 0)]
    assert np.array_equal(still["thread_cpu_ns"], still["end_ns"] - still["start_ns"])
    table = calls.attribute_trace(trace, rule=calls.SlowCallRule(threshold_ns=100_000))
    assert list(table.columns) == list(calls.CALL_COLUMNS)
    assert "unknown" not in set(table["class"])
