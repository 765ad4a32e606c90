"""Sharing a node: CPU shares, the advised split on planted jobs, and two real CPU jobs started
together under no split and an even split."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from codl import share
from codl.analysis import advise as adv
from codl.analysis import model as mdl
from codl.datasets import generate
from codl.errors import CodlError
from codl.pinning import cpulist
from codl.spec import RunSpec
from codl.trace.store import open_trace

NODE = 16


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
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs to split")
    cpus = cpus[:2]
    spec = RunSpec.from_dict(
        {
            "mode": "data+compute",
            "workload": {"batch_size": 4, "image_size": 32},
            "dataset": {"name": "share", "cost": "light", "samples": 16, "height": 40, "width": 48},
            "loader": {"workers": 1, "prefetch_factor": 1},
            "steps": {"warmup": 1, "measured": 4},
        }
    )
    data = tmp_path / "data"
    generate(spec.dataset, data)
    jobs = [
        share.Job(name=n, spec=spec, dataset_dir=data, trace=tmp_path / f"{n}.h5")
        for n in ("a", "b")
    ]
    splits = {"none": None, "even": share.even_counts(2, 2)}
    rows = share.run_shared(jobs, splits, work=tmp_path / "work", cpus=cpus)
    assert len(rows) == 4 and (rows["throughput"] > 0).all()
    # Each job ran inside its share: the run records the CPUs it was allowed.
    for split, shares in (("none", [cpus, cpus]), ("even", [cpus[:1], cpus[1:]])):
        for name, own in zip(("a", "b"), shares, strict=True):
            with open_trace(tmp_path / "work" / split / "0" / f"{name}.h5") as t:
                assert t.attrs["allowed_cpus"] == cpulist(own)
    report = share.share_report(rows)
    assert set(report["split"]) == {"none", "even"}
    assert (report["total"] == report["a"] + report["b"]).all()
