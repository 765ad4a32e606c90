"""CUDA-only checks (skipped without a GPU): CUDA-event durations and the Kineto/CUPTI level."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from codl.datasets import generate
from codl.harness.launch import launch
from codl.spec import DatasetSpec, RunSpec
from codl.trace.store import open_trace

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def gpu_spec(mode: str, *, cupti: bool) -> RunSpec:
    return RunSpec.from_dict(
        {
            "mode": mode,
            "device": "cuda",
            "workload": {
                "model": "resnet18",
                "batch_size": 32,
                "image_size": 96,
                "precision": "bf16",
                "channels_last": True,
            },
            "dataset": {"samples": 256, "height": 120, "width": 160},
            "loader": {"workers": 4, "pin_memory": True},
            "steps": {"warmup": 3, "measured": 6},
            "trace": {"cupti": cupti, "cupti_steps": 3},
        }
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cuda") / "jpeg"
    generate(DatasetSpec(samples=256, height=120, width=160), out)
    return out


def test_cuda_events_give_gpu_durations_of_every_compute_phase(
    tmp_path: Path, dataset: Path
) -> None:
    spec = gpu_spec("data+compute", cupti=False)
    trace = launch(spec, trace_path=tmp_path / "t.h5", dataset_dir=dataset)
    with open_trace(trace) as t:
        app = t.table("events/app")
        dev = t.table("samples/device")
    for phase in ("forward", "backward", "optimizer", "compute", "h2d", "step"):
        rows = app[app["phase"].astype(str) == phase]
        assert (rows["gpu_ns"] > 0).all(), phase
    # The GPU view of a step never exceeds its host span (events sit inside it).
    step = app[app["phase"].astype(str) == "step"]
    assert (step["gpu_ns"] <= step["end_ns"] - step["start_ns"]).all()
    assert len(dev) == spec.steps.total + 1
    assert (dev["sm_clock"] > 0).all()


def test_kineto_launches_land_inside_their_steps(tmp_path: Path, dataset: Path) -> None:
    spec = gpu_spec("data+compute", cupti=True)
    trace = launch(
        spec, trace_path=tmp_path / "t.h5", dataset_dir=dataset, kineto_dir=tmp_path / "k"
    )
    with open_trace(trace) as t:
        cuda = t.table("events/cuda")
        app = t.table("events/app")
        attrs = t.attrs
    assert attrs["cupti"] == "on"
    assert abs(attrs["cupti_alignment_ns"]) < 2_000_000
    assert list((tmp_path / "k").glob("*.json.gz"))
    launches = cuda[cuda["name"].astype(str).str.contains("LaunchKernel")]
    assert len(launches) > 100
    window = range(spec.steps.warmup, spec.steps.warmup + spec.trace.cupti_steps)
    inside = launches[launches["step"].isin(window)]
    assert len(inside) >= 0.95 * len(launches)
    # Each launch lies within its step's span, and forward/backward launches within those phases.
    spans = app[app["phase"].astype(str) == "step"].set_index("step")
    s = inside["step"].to_numpy()
    assert (inside["start_ns"].to_numpy() >= spans.loc[s, "start_ns"].to_numpy()).all()
    assert (inside["end_ns"].to_numpy() <= spans.loc[s, "end_ns"].to_numpy()).all()
    kernels = cuda[cuda["kind"].astype(str) == "kernel"]
    assert len(kernels) > 100
    assert np.median((kernels["end_ns"] - kernels["start_ns"]).to_numpy()) > 0
