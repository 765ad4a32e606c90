"""Sharing a node: CPU shares, the advised split on planted jobs, and two real CPU jobs started
together under no split and an even split."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from codl import share
from codl.analysis import advise as adv
from codl.analysis import model as mdl
from codl.analysis.advisor_config import share_settings, share_specs
from codl.config import build_plan, load_yaml
from codl.datasets import generate
from codl.errors import CodlError
from codl.paths import ResultPaths
from codl.pinning import cpulist
from codl.spec import DeviceKind
from codl.trace.store import open_trace

NODE = 16
CONFIG = Path(__file__).resolve().parents[1] / "config" / "share-cpu.yaml"


def planted_job(rate: float, compute: float) -> mdl.Fit:
    """A job whose loader delivers ``rate`` samples/s per worker (one worker per core) and whose
    GPU takes ``compute`` samples/s, without interference: the best share is known."""
    return mdl.Fit(
        params=mdl.Params(
            rate=rate,
            kappa=1.0,
            compute={"none": compute},
            compute_ms={"none": 100.0},
            k={"none": 0.0},
        ),
        boot=(),
        node=mdl.Node(
            device="cpu", combined_mode="data+compute", world=1, batch=32, pin_memory=False
        ),
        cores=NODE,
        run_cv=0.0,
        loader_item_rate=rate,
        measured_workers=(1, 2 * NODE),
    )


def test_the_advised_split_feeds_the_hungry_loader() -> None:
    # Job 0 needs 10 loader cores (+1 for its main thread) to feed compute, job 1 needs 2.5 (+1).
    hungry, light = planted_job(100.0, 1000.0), planted_job(400.0, 1000.0)
    counts, table = adv.advise_split([hungry, light], cores=NODE)
    # 11/5 and 12/4 both feed both jobs fully; the one closer to even wins.
    assert counts == [11, 5]
    best = table["score"].max()
    assert best == pytest.approx(2.0)
    even = table[table["split"] == (8, 8)].iloc[0]
    assert even["rel_0"] == pytest.approx(0.7) and even["rel_1"] == pytest.approx(1.0)
    assert table[table["split"] == (12, 4)]["score"].iloc[0] == pytest.approx(2.0)
    with pytest.raises(mdl.ModelError, match="a split needs >= 2"):
        adv.advise_split([hungry], cores=NODE)


def test_cpu_shares_are_contiguous_and_checked() -> None:
    assert share.cpu_shares([3, 1, 2, 0], [3, 1], jobs=2) == [(0, 1, 2), (3,)]
    assert share.cpu_shares([0, 1], None, jobs=3) == [(0, 1)] * 3
    assert share.even_counts(5, 2) == [3, 2]
    with pytest.raises(CodlError, match="add up to at most the 2 CPUs"):
        share.cpu_shares([0, 1], [2, 1], jobs=2)
    with pytest.raises(CodlError, match="one share per job"):
        share.cpu_shares([0, 1], [1], jobs=2)
    with pytest.raises(CodlError, match="cannot be split between 3 jobs"):
        share.even_counts(2, 3)


def test_the_report_totals_and_compares_with_the_even_split() -> None:
    rows = pd.DataFrame(
        [
            ("even", 0, "a", "0", 10.0),
            ("even", 0, "b", "1", 20.0),
            ("advised", 0, "a", "0-2", 15.0),
            ("advised", 0, "b", "3", 20.0),
            ("advised", 1, "a", "0-2", 17.0),
            ("advised", 1, "b", "3", 18.0),
        ],
        columns=["split", "repeat", "job", "cpus", "throughput"],
    )
    report = share.share_report(rows).set_index("split")
    assert report.loc["advised", "a"] == 16.0 and report.loc["advised", "total"] == 35.0
    assert report.loc["even", "total"] == 30.0
    assert report.loc["advised", "mean_speedup_vs_even"] == pytest.approx((1.6 + 0.95) / 2)
    assert report.loc["advised", "cpus_a"] == "0-2"


@pytest.mark.slow
def test_two_cpu_jobs_share_a_node(tmp_path: Path) -> None:
    """config/share-cpu.yaml as the workflow's `share` rule runs it, in this process."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs to split")
    cfg = load_yaml(CONFIG)
    paths = ResultPaths(root=tmp_path)
    plan = build_plan(cfg)
    for (name, _tier), dataset in plan.datasets().items():
        generate(dataset, paths.dataset_dir(name))
    figure = tmp_path / "share.png"
    report = share.share_to(
        cfg, paths=paths, rows_out=paths.share_rows, table_out=paths.share_table, figures=[figure]
    )
    rows = pd.read_csv(paths.share_rows)
    assert len(rows) == 4 and (rows["throughput"] > 0).all()
    assert figure.stat().st_size > 0
    # Each job ran inside its share: the run records the CPUs it was allowed.
    first, second = share.cpu_shares(cpus, share.even_counts(len(cpus), 2), jobs=2)
    for split, shares in (("none", [cpus, cpus]), ("even", [first, second])):
        for name, own in zip(("job-light", "job-heavy"), shares, strict=True):
            with open_trace(paths.share / split / "0" / f"{name}.h5") as t:
                assert t.attrs["allowed_cpus"] == cpulist(own)
    assert set(report["split"]) == {"none", "even"}
    assert np.allclose(report["total"], report["job-light"] + report["job-heavy"])
    assert report.set_index("split").loc["even", "mean_speedup_vs_even"] == pytest.approx(1.0)


def test_the_share_section_is_checked() -> None:
    cfg = load_yaml(CONFIG)
    plan = build_plan(cfg)
    assert list(share_specs(cfg, plan)) == ["job-light", "job-heavy"]
    with pytest.raises(CodlError, match="one CPU count per job"):
        share_settings({"share": {"jobs": ["a", "b"], "advised": [1]}})
    with pytest.raises(CodlError, match="'nope' is not an experiment"):
        share_specs({**cfg, "share": {"jobs": ["job-light", "nope"]}}, plan)
    wide = build_plan(
        {
            **cfg,
            "experiments": [
                {**cfg["experiments"][0], "factors": {"loader.workers": [1, 2]}},
                cfg["experiments"][1],
            ],
        }
    )
    with pytest.raises(CodlError, match="plans 2 runs, expected exactly one"):
        share_specs(cfg, wide)


def test_each_cuda_job_sees_a_gpu_of_its_own() -> None:
    cfg = load_yaml(CONFIG)
    specs = list(share_specs(cfg, build_plan(cfg, source=str(CONFIG))).values())
    cuda = [dataclasses.replace(s, device=DeviceKind.CUDA) for s in specs]
    assert share.gpus_for(specs, 0) == [None, None]
    assert share.gpus_for(cuda, 2) == [0, 1]
    assert share.gpus_for([specs[0], cuda[1]], 1) == [None, 0]
    with pytest.raises(CodlError, match="2 CUDA jobs need a GPU each, this node shows 1"):
        share.gpus_for(cuda, 1)
    job = share.Job(name="a", spec=cuda[1], dataset_dir=None, trace=Path("a.h5"), gpu=1)
    env = share.job_env(job, {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1"}
    cpu_job = dataclasses.replace(job, gpu=None)
    assert share.job_env(cpu_job, {"PATH": "/bin"}) == {"PATH": "/bin"}
