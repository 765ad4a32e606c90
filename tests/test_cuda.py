"""CUDA-only checks (skipped without a GPU): CUDA-event durations and the two CUPTI levels."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from codl.datasets import generate
from codl.harness.launch import launch
from codl.spec import DatasetSpec, RunSpec
from codl.trace import cuda_api
from codl.trace.store import open_trace

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def gpu_spec(mode: str, *, cupti: bool, cuda_api: bool = False) -> RunSpec:
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
            "trace": {"cupti": cupti, "cupti_steps": 3, "cuda_api": cuda_api},
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


def run_in_fresh_process(spec: RunSpec, tmp_path: Path, dataset: Path) -> Path:
    """`codl run` of ``spec`` in a new process, as the workflow runs it: once torch.profiler has
    run in a process, Kineto keeps CUPTI's only subscriber slot until the process ends."""
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_dict()))
    trace = tmp_path / "t.h5"
    cmd = [sys.executable, "-m", "codl.cli", "run", str(tmp_path / "spec.json")]
    cmd += ["--trace", str(trace), "--dataset-dir", str(dataset)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return trace


def test_callback_level_times_every_launch_of_every_step(tmp_path: Path, dataset: Path) -> None:
    spec = gpu_spec("data+compute", cupti=False, cuda_api=True)
    trace = run_in_fresh_process(spec, tmp_path, dataset)
    with open_trace(trace) as t:
        cuda = t.table("events/cuda")
        app = t.table("events/app")
        threads = t.table("threads")
        attrs = t.attrs
    assert attrs["cuda_api"] == "on"
    assert attrs["cuda_api_dropped"] == 0
    assert "cudaLaunchKernel" in attrs["cuda_api_functions"]
    names = cuda["name"].astype(str)
    launches = cuda[names.str.contains("LaunchKernel")]
    # Every step launches, and about as often as every other step (the same model each time).
    per_step = launches[launches["step"] >= 0].groupby("step").size()
    assert list(per_step.index) == list(range(spec.steps.total))
    measured = per_step.loc[spec.steps.warmup :]
    assert measured.min() > 100
    assert measured.max() <= 1.2 * measured.min()
    # Launches come from this process's launch and autograd threads, inside their step spans.
    ours = set(threads[threads["role"].astype(str).isin(["launch", "autograd"])]["tid"])
    assert set(launches["tid"]) <= ours
    spans = app[app["phase"].astype(str) == "step"].set_index("step")
    inside = launches[launches["step"] >= 0]
    s = inside["step"].to_numpy()
    assert (inside["start_ns"].to_numpy() >= spans.loc[s, "start_ns"].to_numpy()).all()
    dur = (launches["end_ns"] - launches["start_ns"]).to_numpy()
    assert (dur > 0).all()
    assert np.median(dur) < 1_000_000  # a launch queues work; it does not wait for it
    # The per-step synchronisation is seen as a sync call that lasts as long as the GPU work.
    assert (cuda["kind"].astype(str) == "sync").any()


def _cupti_include_dirs() -> list[Path]:
    import nvidia  # the CUDA wheels PyTorch depends on

    roots = [Path("/usr/local/cuda/extras/CUPTI/include"), Path("/usr/local/cuda/include")]
    for root in nvidia.__path__:
        roots += sorted(Path(root).glob("*/include"))
    return [r for r in roots if r.is_dir()]


def test_shim_callback_data_matches_the_cupti_header(tmp_path: Path) -> None:
    dirs = _cupti_include_dirs()
    if not any((d / "cupti_callbacks.h").exists() for d in dirs):
        pytest.skip("no cupti_callbacks.h on this machine")
    shim = Path(cuda_api.__file__).with_name("cuda_api_shim.c")
    fields = [
        ("callback_site", "callbackSite"),
        ("function_name", "functionName"),
        ("context_uid", "contextUid"),
        ("correlation_data", "correlationData"),
        ("correlation_id", "correlationId"),
    ]
    checks = "\n".join(
        f"_Static_assert(offsetof(codl_callback_data, {a}) == offsetof(CUpti_CallbackData, {b}),"
        f' "{a}");'
        for a, b in fields
    )
    src = tmp_path / "layout.c"
    src.write_text(
        "#define _GNU_SOURCE\n#include <stddef.h>\n#include <cupti.h>\n"
        f'#include "{shim}"\n{checks}\n'
        '_Static_assert(sizeof(codl_callback_data) == sizeof(CUpti_CallbackData), "size");\n'
        '_Static_assert(CODL_DOMAIN_RUNTIME == CUPTI_CB_DOMAIN_RUNTIME_API, "runtime");\n'
        '_Static_assert(CODL_DOMAIN_DRIVER == CUPTI_CB_DOMAIN_DRIVER_API, "driver");\n'
    )
    include = [f"-I{d}" for d in dirs]
    proc = subprocess.run(
        ["cc", "-std=c11", "-fsyntax-only", *include, str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
