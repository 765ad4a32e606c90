"""The workload interface (codl.harness.workloads): references resolved or refused in one line,
a workload from outside the package run by name (`module:factory`) and through the workflow
(an installed example package's entry point), and the transformer workload end to end on CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from codl.config import build_plan
from codl.datasets import generate
from codl.errors import ConfigError
from codl.harness import workloads
from codl.harness.handoff import RingLoader
from codl.harness.launch import launch
from codl.paths import ResultPaths
from codl.spec import DatasetKind, DatasetSpec, RunSpec
from codl.trace.store import open_trace
from test_workflow import snakemake

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "codl-example-workload"

BAD_MODULE = """
from dataclasses import dataclass

number = 5


@dataclass(frozen=True)
class Half:
    # A workload but for its loss.
    name: str = "half"
    dataset_kind: str = "jpeg"

    def build_model(self, spec): ...
    def open_dataset(self, root, spec): ...
    def synthetic_batch(self, spec, device): ...


half = Half()


def raising():
    raise RuntimeError("no GPU here\\nsecond line")
"""

# (reference, what the one line must say)
BAD_REFERENCES = [
    ("no_such_pkg_xyz.mod:make", "module 'no_such_pkg_xyz.mod' cannot be imported"),
    ("codl_bad_wl:absent", "module 'codl_bad_wl' has no attribute 'absent'"),
    ("codl_bad_wl:number", "got int 5, expected a workload"),
    ("codl_bad_wl:half", "Half has no method 'loss'"),
    ("codl_bad_wl:raising", "the factory raised RuntimeError: no GPU here"),
    ("resnet51", "no such workload"),
]


@pytest.fixture
def bad_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "codl_bad_wl.py").write_text(BAD_MODULE)
    monkeypatch.syspath_prepend(str(mods))
    return mods


def _config(model: str) -> dict[str, Any]:
    return {
        "defaults": {"device": "cpu"},
        "experiments": [{"name": "e", "base": {"workload": {"model": model}}}],
    }


@pytest.mark.parametrize(("ref", "says"), BAD_REFERENCES)
def test_a_bad_workload_reference_is_one_line_naming_it(
    bad_module: Path, ref: str, says: str
) -> None:
    with pytest.raises(ConfigError) as info:
        build_plan(_config(ref))
    lines = [p for p in info.value.problems if "workload.model" in p]
    assert len(lines) == 1, info.value.problems
    assert f"workload.model: got {ref!r}: " in lines[0] and says in lines[0], lines[0]
    assert "\n" not in lines[0] and "Traceback" not in lines[0]


def test_codl_plan_refuses_the_five_kinds_without_a_traceback(
    bad_module: Path, tmp_path: Path
) -> None:
    cfg = {
        "defaults": {"device": "cpu"},
        "experiments": [
            {"name": f"e{i}", "base": {"workload": {"model": ref}}}
            for i, (ref, _) in enumerate(BAD_REFERENCES[:5])
        ],
    }
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {
        **os.environ,
        "PYTHONPATH": f"{bad_module}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "codl.cli", "plan", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    for ref, says in BAD_REFERENCES[:5]:
        hits = [line for line in proc.stderr.splitlines() if f"got {ref!r}" in line]
        assert len(hits) == 1 and says in hits[0], proc.stderr


def test_the_shipped_workloads_are_the_interface() -> None:
    assert set(workloads.names()) >= {
        "resnet50",
        "resnet18",
        "resnet_tiny",
        "cosmoflow",
        "gpt2_small",
        "gpt_tiny",
    }
    for name in workloads.names():
        impl = workloads.get(name).impl
        assert isinstance(impl, workloads.Workload), name
    assert workloads.get("gpt_tiny").dataset_kind is DatasetKind.TEXT


def test_a_plugin_data_set_kind_and_generator_are_checked(bad_module: Path) -> None:
    cfg = {
        "defaults": {"device": "cpu", "mode": "data"},
        "experiments": [
            # A workload of kind workload with a shipped generator name: codl builds jpeg sets.
            {"name": "a", "base": {"dataset": {"kind": "workload", "generator": "resnet_tiny"}}},
            {"name": "b", "base": {"dataset": {"kind": "text"}}},
        ],
    }
    with pytest.raises(ConfigError) as info:
        build_plan(cfg)
    text = "\n".join(info.value.problems)
    assert "dataset.kind: got 'workload', but workload 'resnet_tiny' reads 'jpeg'" in text
    assert "dataset.generator: 'resnet_tiny' reads 'jpeg' data sets" in text
    assert "dataset.kind: got 'text', but workload 'resnet_tiny' reads 'jpeg'" in text


def _example_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))


def test_a_workload_named_module_factory_runs_with_its_own_data_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _example_on_path(monkeypatch)
    ref = "codl_example:SignalWorkload"
    spec = RunSpec.from_dict(
        {
            "mode": "data+compute",
            "workload": {"model": ref, "batch_size": 4, "classes": 4},
            "dataset": {"name": "sig", "kind": "workload", "samples": 16, "classes": 4},
            "loader": {"workers": 1},
            "steps": {"warmup": 1, "measured": 3},
        }
    )
    # The generator is the run's workload unless named.
    assert spec.dataset.generator == ref
    assert build_plan({"defaults": spec.to_dict() | {"repeat": 0}, "experiments": [{"name": "x"}]})
    data = tmp_path / "sig"
    manifest = generate(spec.dataset, data)
    assert manifest["files"] == 16 and len(list(data.glob("signal_*.npy"))) == 16
    trace = tmp_path / "trace.h5"
    launch(spec, trace_path=trace, dataset_dir=data)
    with open_trace(trace) as t:
        t.verify()
        loader = t.table("events/loader")
        app = t.table("events/app")
    stages = loader.groupby(loader["stage"].astype(str)).size()
    # Every sample of every step through the workload's own fetch, decode and transform.
    assert stages["fetch"] == stages["decode"] == stages["transform"] == 4 * 4
    assert "forward" in set(app["phase"].astype(str))


def test_text_data_set_packs_bpe_tokens_into_shifted_sequences(tmp_path: Path) -> None:
    spec = DatasetSpec(name="t", kind=DatasetKind.TEXT, samples=40, classes=600)
    manifest = generate(spec, tmp_path / "t")
    assert manifest["text"]["vocab"] <= 600 and manifest["text"]["tokens"] > 40
    from codl.harness.text import PackedDocuments

    ds = PackedDocuments(tmp_path / "t", 32, vocab=600)
    offsets = np.load(tmp_path / "t" / "offsets.npy")
    lengths = np.diff(offsets)
    assert lengths.max() > 4 * lengths.min()  # documents of varied length
    for i in (0, len(ds) - 1):  # the last wraps around to the first document
        x, y, row = ds[i]
        assert x.shape == y.shape == (32,) and x.dtype == y.dtype
        assert bool((x[1:] == y[:-1]).all())
        assert row[0] == i and row[5] <= row[6] <= row[7] <= row[8]
    # The sample is document i's text, tokenized by the data set's BPE.
    first = (tmp_path / "t" / "documents.txt").read_bytes()[offsets[0] : offsets[1]].decode()
    ids = ds.tokenizer.encode(first).ids
    assert ds[0][0][: min(16, len(ids))].tolist() == ids[: min(16, len(ids))]
    with pytest.raises(Exception, match=r"more than workload\.classes"):
        PackedDocuments(tmp_path / "t", 32, vocab=300)
    # The ring hand-off takes the samples as they are: token batches and their timing rows.
    ring = RingLoader(
        ds, batch_size=4, workers=2, prefetch_factor=2, generator=torch.Generator().manual_seed(0)
    )
    try:
        batches = [next(iter(ring)) for _ in range(2)]
        x, y = ring.to_device(batches[-1], torch.device("cpu"))
    finally:
        ring.close()
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.long
    assert bool((x[:, 1:] == y[:, :-1]).all())
    assert {int(w) for b in batches for w in b.items[:, 1]} <= {0, 1}


def test_gpt_tiny_runs_end_to_end_through_codl_run(tmp_path: Path) -> None:
    spec = {
        "mode": "data+compute",
        "workload": {"model": "gpt_tiny", "batch_size": 4, "classes": 512, "seq_len": 32},
        "dataset": {"name": "txt", "kind": "text", "samples": 48, "classes": 512},
        "loader": {"workers": 2},
        "steps": {"warmup": 1, "measured": 3},
    }
    data = tmp_path / "txt"
    cli = [sys.executable, "-m", "codl.cli"]
    ds_json = json.dumps(spec["dataset"])
    subprocess.run(
        [*cli, "dataset", "--spec-json", ds_json, "--out", str(data)], check=True, timeout=300
    )
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(RunSpec.from_dict(spec).to_dict()))
    trace = tmp_path / "trace.h5"
    proc = subprocess.run(
        [*cli, "run", str(spec_path), "--trace", str(trace), "--dataset-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open_trace(trace) as t:
        t.verify()
        loader = t.table("events/loader")
        app = t.table("events/app")
    decode = loader[loader["stage"].astype(str) == "decode"]
    assert len(decode) == 4 * 4
    # Tokenizing is real work in the workers: not the main process, and not nothing.
    assert (decode["worker"] >= 0).all()
    assert (decode["end_ns"] - decode["start_ns"]).median() > 10_000
    assert {"forward", "backward", "optimizer"} <= set(app["phase"].astype(str))


@pytest.mark.slow
def test_gpt_tiny_through_the_workflow(tmp_path: Path) -> None:
    cfg = {
        "defaults": {
            "workload": {"model": "gpt_tiny", "batch_size": 4, "classes": 512, "seq_len": 32},
            "dataset": {"name": "wf-text", "kind": "text", "samples": 48, "classes": 512},
            "loader": {"workers": 2},
            "steps": {"warmup": 1, "measured": 3},
        },
        "experiments": [{"name": "lm", "factors": {"mode": ["compute", "data+compute"]}}],
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    work = tmp_path / "w"
    work.mkdir()
    _, jobs = snakemake(work, path)
    assert jobs["dataset"] == 1 and jobs["run"] == 2
    runs = pd.read_csv(ResultPaths(work, set_name="c").runs_table)
    assert len(runs) == 2
    assert (work / "resources" / "datasets" / "wf-text" / "tokenizer.json").is_file()


@pytest.mark.slow
def test_an_installed_example_package_runs_through_the_workflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Installed into a throwaway directory on PYTHONPATH (its entry point with it): nothing
    # in the test environment changes.
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    # From a copy: building writes build/ and *.egg-info next to the sources.
    source = shutil.copytree(
        EXAMPLE, tmp_path / "example", ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    subprocess.run([*pip, "--target", str(site), str(source)], check=True, timeout=300)
    assert list(site.glob("codl_example_workload-*.dist-info/entry_points.txt"))
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    work = tmp_path / "w"
    work.mkdir()
    _, jobs = snakemake(work, EXAMPLE / "config.yaml")
    assert jobs["dataset"] == 1 and jobs["run"] == 3
    runs = pd.read_csv(ResultPaths(work, set_name="config").runs_table)
    assert set(runs["model"]) == {"example-signals"}, runs.columns.tolist()
    manifest = json.loads(
        (work / "resources" / "datasets" / "example-signals" / "MANIFEST.json").read_text()
    )
    assert manifest["spec"]["generator"] == "example-signals" and manifest["files"] == 64


GREEDY_MODULE = """
from codl.harness.workloads import ImageClassifier, _resnet_tiny


class Greedy(ImageClassifier):
    def ddp_options(self, spec):
        return {"bucket_cap_mb": 1, "static_graph": True}


greedy = Greedy("greedy", "asks DDP for what the harness sets", _resnet_tiny)
"""


def test_ddp_options_outside_the_hints_are_refused_at_plan_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "codl_greedy_wl.py").write_text(GREEDY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        build_plan(_config("codl_greedy_wl:greedy"))
    (line,) = info.value.problems
    assert "asks DistributedDataParallel for ['bucket_cap_mb']" in line, line
    assert workloads.get("gpt_tiny").ddp_options(RunSpec().workload) == {
        "gradient_as_bucket_view": True
    }


@pytest.mark.slow
def test_gpt_tiny_trains_under_ddp_on_two_ranks(tmp_path: Path) -> None:
    spec = RunSpec.from_dict(
        {
            "mode": "combined",
            "workload": {"model": "gpt_tiny", "batch_size": 2, "classes": 512, "seq_len": 16},
            "dataset": {"kind": "text", "samples": 24, "classes": 512},
            "loader": {"workers": 1},
            "layout": {"ranks_per_node": 2},
            "steps": {"warmup": 1, "measured": 2},
        }
    )
    data = tmp_path / "txt"
    generate(spec.dataset, data)
    trace = tmp_path / "trace.h5"
    launch(spec, trace_path=trace, dataset_dir=data)
    with open_trace(trace) as t:
        comm = t.table("events/comm")
    # Both ranks reduced every gradient once a step (the tied head and embedding are one).
    model = workloads.get("gpt_tiny").build_model(spec.workload)
    n_params = sum(p.numel() for p in model.parameters())
    for rank in (0, 1):
        step0 = comm[(comm["rank"] == rank) & (comm["step"] == 0)]
        assert step0["bytes"].sum() == 4 * n_params
