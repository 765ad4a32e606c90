"""Sharing a node: CPU shares, the advised split on planted jobs, and two real CPU jobs started
together under no split and an even split."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from codl.advisor import advise as adv
from codl.advisor import model as mdl
from codl.advisor.settings import share_settings, share_specs
from codl.config import build_plan, load_yaml
from codl.datasets import generate
from codl.errors import CodlError
from codl.paths import ResultPaths, ShareFiles
from codl.pinning import cpulist
from codl.spec import DeviceKind
from codl.steps import share
from codl.steps.advisor import fit_results
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


def test_the_pool_is_the_first_cpus_of_the_allowed_set() -> None:
    # share.cpus: a smaller pool on a big node, where the jobs' needs decide the split.
    assert share.share_pool({7, 3, 5, 1}, 0) == [1, 3, 5, 7]
    assert share.share_pool({7, 3, 5, 1}, 3) == [1, 3, 5]
    with pytest.raises(CodlError, match=r"share.cpus: got 5, but this process may use only 4"):
        share.share_pool({7, 3, 5, 1}, 5)
    assert share_settings({"share": {"jobs": ["a", "b"], "cpus": 24}}).cpus == 24
    assert share_settings({"share": {"jobs": ["a", "b"]}}).cpus == 0


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

    # Run again (a rule rerun after a cut): every split is measured, so nothing runs and the
    # rows are the same traces' (the harness refuses to overwrite a trace).
    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a measured split ran again")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(share, "run_together", no_run)
        share.share_to(
            cfg, paths=paths, rows_out=paths.share_rows, table_out=paths.share_table, figures=[]
        )
    pd.testing.assert_frame_equal(pd.read_csv(paths.share_rows), rows)
    # A trace of other CPUs is not this split's: set aside (kept), not reused.
    specs = share_specs(cfg, plan)
    jobs = [
        share.Job(name=n, spec=s, dataset_dir=None, trace=paths.share / "even" / "0" / f"{n}.h5")
        for n, s in specs.items()
    ]
    assert share.measured(jobs, [first, second])
    assert not share.measured(jobs, [second, first])
    # Set aside as <job>.stale-<mtime_ns>.h5, never over an older one of the same name.
    light = jobs[0].trace if jobs[0].name == "job-light" else jobs[1].trace
    taken = light.with_name(f"job-light.stale-{light.stat().st_mtime_ns}.h5")
    taken.write_bytes(b"older")
    want = {j.name: j.trace.read_bytes() for j in jobs}
    share.set_aside(jobs)
    assert not any(j.trace.exists() for j in jobs)
    kept = sorted((paths.share / "even" / "0").glob("*.stale-*.h5"))
    assert len(kept) == 3 and taken.read_bytes() == b"older"
    for name, data in want.items():
        assert [p for p in kept if p.name.startswith(f"{name}.") and p.read_bytes() == data]


def test_the_share_section_is_checked() -> None:
    cfg = load_yaml(CONFIG)
    plan = build_plan(cfg)
    assert list(share_specs(cfg, plan)) == ["job-light", "job-heavy"]
    with pytest.raises(CodlError, match="one entry per job"):
        share_settings({"share": {"jobs": ["a", "b"], "advised": [1]}})
    with pytest.raises(CodlError, match="'nope' is not an experiment"):
        share_specs({**cfg, "share": {"jobs": ["job-light", "nope"]}}, plan)
    wide = {
        **cfg,
        "experiments": [
            {**cfg["experiments"][0], "factors": {"loader.workers": [1, 2]}},
            cfg["experiments"][1],
        ],
    }
    # The plan refuses it (issue 37); share_specs too, for a plan built without the section.
    with pytest.raises(CodlError, match="plans 2 runs, expected exactly one"):
        build_plan(wide)
    with pytest.raises(CodlError, match="plans 2 runs, expected exactly one"):
        share_specs(wide, build_plan({**wide, "share": {}}))


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


def test_the_report_gives_intervals_over_repeats() -> None:
    rows = pd.DataFrame(
        [("even", r, "a", "0", 10.0 + r) for r in range(4)]
        + [("even", r, "b", "1", 20.0) for r in range(4)]
        + [("wide", r, "a", "0-2", 12.0 + r) for r in range(4)]
        + [("wide", r, "b", "3", 18.0) for r in range(4)]
        + [("once", 0, "a", "0", 9.0), ("once", 0, "b", "1", 19.0)],
        columns=["split", "repeat", "job", "cpus", "throughput"],
    )
    report = share.share_report(rows).set_index("split")
    wide = report.loc["wide"]
    assert wide["a"] == 13.5 and wide["total"] == 31.5 and wide["repeats"] == 4
    # Resampled means stay within the repeats' range; b never varies.
    assert 12.0 <= wide["a_lo"] < 13.5 < wide["a_hi"] <= 15.0
    assert wide["b_lo"] == wide["b_hi"] == 18.0
    assert wide["speedup_a_vs_even"] == pytest.approx(13.5 / 11.5)
    assert wide["total_vs_even"] == pytest.approx(31.5 / 31.5)
    assert wide["total_vs_even_lo"] < 1.0 < wide["total_vs_even_hi"]
    # One repeat: a mean, no interval.
    assert report.loc["once", "a"] == 9.0 and np.isnan(report.loc["once", "a_lo"])


def test_splits_run_repeat_major_in_rotated_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []

    def fake_together(jobs: list[share.Job], shares: list[tuple[int, ...]]) -> None:
        order.append(jobs[0].trace.parent.parent.name)

    monkeypatch.setattr(share, "run_together", fake_together)
    monkeypatch.setattr(share, "throughput_of", lambda trace: 1.0)
    cfg = load_yaml(CONFIG)
    specs = share_specs(cfg, build_plan(cfg))
    jobs = [
        share.Job(name=n, spec=s, dataset_dir=None, trace=tmp_path / f"{n}.h5")
        for n, s in specs.items()
    ]
    splits = {"none": None, "even": [1, 1], "x": [1, 1]}
    rows = share.run_shared(jobs, splits, work=tmp_path, cpus=[0, 1], repeats=3)
    assert order == ["none", "even", "x", "even", "x", "none", "x", "none", "even"]
    assert len(rows) == 18 and set(rows["repeat"]) == {0, 1, 2}


def test_named_and_fitted_splits_are_checked() -> None:
    base = {"jobs": ["a", "b"]}
    s = share_settings({"share": {**base, "fixed": {"small-first": [1, 3]}}})
    assert s.fixed == (("small-first", (1, 3)),)
    with pytest.raises(CodlError, match=r"share.fixed.x: got \[1\], expected one entry per job"):
        share_settings({"share": {**base, "fixed": {"x": [1]}}})
    with pytest.raises(CodlError, match="expected one of them"):
        share_settings({"share": {**base, "advised": [1, 1], "advise_from": ["r1", "r2"]}})
    with pytest.raises(CodlError, match=r"share\.advise_from: got"):
        share_settings({"share": {**base, "advise_from": ["r1"]}})
    cfg = load_yaml(CONFIG)
    for name in ("even", "../up", "a/b"):
        bad = {**cfg, "share": {**cfg["share"], "fixed": {name: [1, 1]}}}
        with pytest.raises(CodlError, match="share"):
            build_plan(bad)


def test_the_advised_split_is_fitted_from_results_directories(tmp_path: Path) -> None:
    from test_model import planted_tables

    runs, steps = planted_tables(repeats=2, steps=40)
    dirs = []
    for name in ("one", "two"):
        d = tmp_path / name
        (d / "tables").mkdir(parents=True)
        runs.to_csv(d / "tables" / "runs.csv", index=False)
        steps.to_csv(d / "tables" / "steps.csv.gz", index=False)
        (d / "config.yaml").write_text("slurm: {cpus_per_rank: 16}\n")
        dirs.append(str(d))
    # The split reads the point fit; a few bootstrap replicates keep the test short.
    counts = share.advised_split(dirs, 24, tmp_path / "work", boot=4)
    fits = [fit_results(Path(d), boot=4).fit for d in dirs]
    assert counts == adv.advise_split(fits, cores=24)[0]
    scored = pd.read_csv(ShareFiles(tmp_path / "work").advised_splits)
    assert len(scored) == 23 and {"score", "rel_0", "rel_1"} <= set(scored.columns)
    with pytest.raises(CodlError, match=r"share\.advise_from: .*missing table"):
        share.advised_split([dirs[0], str(tmp_path / "nowhere")], 24, tmp_path / "work", boot=4)


def test_an_advised_split_equal_to_another_is_run_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = share_settings(
        {"share": {"jobs": ["a", "b"], "advise_from": ["r1", "r2"], "fixed": {"f": [3, 1]}}}
    )
    monkeypatch.setattr(share, "advised_split", lambda dirs, n, work: [2, 2])
    splits, advised_as = share.splits_for(settings, 4, 2, tmp_path)
    assert splits == {"none": None, "even": [2, 2], "f": [3, 1]} and advised_as == "even"
    monkeypatch.setattr(share, "advised_split", lambda dirs, n, work: [1, 3])
    splits, advised_as = share.splits_for(settings, 4, 2, tmp_path)
    assert list(splits) == ["none", "even", "advised", "f"] and splits["advised"] == [1, 3]
    assert advised_as == "advised"
    rows = pd.DataFrame(
        [(sp, 0, j, "0", 1.0) for sp in ("even", "f") for j in ("a", "b")],
        columns=["split", "repeat", "job", "cpus", "throughput"],
    )
    report = share.share_report(rows, advised="even").set_index("split")
    assert report["advised"].to_dict() == {"even": True, "f": False}
