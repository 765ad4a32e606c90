"""The advisor: planted optima are found, ties go to loader headroom (or, asked, to fewer cores),
the verification config is a valid plan holding the advice and its neighbours, and `codl advise`
fails in one line."""

from __future__ import annotations

import math
import shlex
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml

from codl.advisor import advise as adv
from codl.advisor import model as mdl
from codl.cli import advise as advise_cli
from codl.config import build_plan, load_plan, load_yaml
from test_model import BATCH, COMPUTE, CORES, RATE, planted_tables

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fit() -> mdl.Fit:
    runs, steps = planted_tables()
    return mdl.fit(mdl.run_data(runs, steps), cores=CORES, boot=10, seed=0)


def test_compute_bound_optimum(fit: mdl.Fit) -> None:
    # 16 cores: the loader could deliver up to 400 * 0.9 * 13 = 4680 samples/s, more than
    # compute's 3500 (`none`) or 3200 (`isolated`). The fewest workers that feed `none`:
    # 9 x 400 = 3600 >= 3500, while 8 x 400 = 3200 is 9 % short. More workers add nothing until
    # they overload the cores (13 workers keep 13 x 3500 / 4680 = 9.7 runnable on the loader's 13
    # cores), then inflate compute; `none` needs no launch CPUs of its own. The plateau is
    # 9..~17 workers: headroom (the default) takes one worker per loader core, 13; fewest-cores
    # its edge, 9.
    a = adv.advise(fit, cores=CORES)
    assert (a.policy, a.workers, a.launch_cores, a.launch_set) == ("none", 13, None, 0)
    edge = adv.advise(fit, cores=CORES, prefer=adv.Prefer.FEWEST_CORES)
    assert (edge.policy, edge.workers, edge.launch_set) == ("none", 9, 0)
    assert edge.throughput == pytest.approx(a.throughput, rel=0.01)
    assert a.bound == "compute"
    assert a.throughput == pytest.approx(COMPUTE["none"], rel=0.05)
    assert a.throughput_lo <= a.throughput <= a.throughput_hi
    assert a.pred_lo <= a.throughput_lo and a.throughput_hi <= a.pred_hi
    # Past the loader's cores the grid shows the interference the advice avoids.
    none = a.grid[(a.grid["policy"] == "none")].set_index("workers")["throughput"]
    assert none[32] < none[24] < none[9]


def test_loader_bound_optimum(fit: mdl.Fit) -> None:
    # 10 cores: 3 go to the launch roles, the loader saturates at 0.9 x 7 = 6.3 workers, i.e.
    # 2520 samples/s < compute. 7 workers reach it; 6 deliver 2400 (5 % short).
    a = adv.advise(fit, cores=10)
    assert (a.policy, a.workers, a.launch_set) == ("none", 7, 0)
    assert a.bound == "loader"
    assert a.throughput == pytest.approx(RATE * 0.9 * 7, rel=0.05)
    assert any("advised for 10" in n for n in a.notes)


def test_ties_go_to_fewer_cores(fit: mdl.Fit) -> None:
    # Only `isolated`: 8 x 400 = 3200 = its compute capacity; the launch set stays `auto`
    # (3 CPUs), since the extra launch CPUs of the grid cost cores and buy nothing.
    fewest = adv.Prefer.FEWEST_CORES
    a = adv.advise(fit, cores=CORES, policies=["isolated"], prefer=fewest)
    assert (a.policy, a.workers, a.launch_cores, a.launch_set) == ("isolated", 8, None, 3)
    grid = a.grid
    top = grid["throughput"].max()
    tied = grid[grid["throughput"] >= top * 0.99]
    assert len(tied) > 1
    assert (tied["cores_used"] >= 3 + 8).all()
    # A zero tolerance still prefers fewer cores among exact ties (the flat compute plateau).
    assert adv.advise(fit, cores=CORES, policies=["isolated"], tie=0.0, prefer=fewest).workers <= 9


def test_ties_go_to_headroom_up_to_the_loader_cores(fit: mdl.Fit) -> None:
    # The same plateau under the default rule: the fewest launch CPUs (`auto`), then one worker
    # per loader core (16 - 3 = 13), not more: workers beyond the loader's cores crowd them.
    a = adv.advise(fit, cores=CORES, policies=["isolated"])
    assert (a.policy, a.workers, a.launch_cores, a.launch_set) == ("isolated", 13, None, 3)
    # 14 workers are on the plateau too (no overload yet), but take no core more.
    grid = a.grid[a.grid["launch_cores"].isna()].set_index("workers")["throughput"]
    assert grid[14] >= a.throughput * 0.99


def test_budget_without_a_loader_core_is_refused(fit: mdl.Fit) -> None:
    with pytest.raises(mdl.ModelError, match="--cores 3: the launch roles take every core"):
        adv.advise(fit, cores=3)


def test_unknown_policy_is_refused(fit: mdl.Fit) -> None:
    with pytest.raises(mdl.ModelError, match=r"\['numa'\].*\['isolated', 'none'\]"):
        adv.advise(fit, cores=CORES, policies=["numa"])


def test_verification_config_is_a_plan_with_the_advice_and_its_neighbours(fit: mdl.Fit) -> None:
    a = adv.advise(fit, cores=CORES)
    defaults = load_yaml(REPO / "config" / "config.yaml")["defaults"]
    cfg = adv.verification_config(a, fit, defaults=defaults, worker_step=2, repeats=2)
    text = adv.render_config(cfg, a, "results/x")
    plan = build_plan(yaml.safe_load(text))
    settings = {
        (s.mode.value, s.pinning.policy.value, s.loader.workers if s.mode.loads else 0)
        for s in plan.specs.values()
    }
    assert {("data+compute", "none", w) for w in (11, 13, 15)} <= settings
    assert ("data+compute", "isolated", 13) in settings
    assert {("compute", "none", 0), ("compute", "isolated", 0)} <= settings
    assert {("data", "none", w) for w in (11, 13, 15)} <= settings
    assert {s.repeat for s in plan.specs.values()} == {0, 1}
    assert cfg["slurm"]["cpus_per_rank"] == CORES
    assert "&id" not in text  # lists written out, not as YAML anchors
    assert text.startswith("# Verification of `codl advise results/x`")


def _write_results(root: Path, runs: pd.DataFrame, steps: pd.DataFrame, *, config: bool) -> Path:
    (root / "tables").mkdir(parents=True)
    runs.to_csv(root / "tables" / "runs.csv", index=False)
    steps.to_csv(root / "tables" / "steps.csv.gz", index=False)
    if config:
        cfg = load_yaml(REPO / "config" / "config.yaml")
        cfg["defaults"]["workload"]["batch_size"] = BATCH
        cfg["slurm"]["cpus_per_rank"] = CORES
        (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    return root


@pytest.mark.parametrize("name", ["plain", "with space", "ünïcødé"])
def test_main_end_to_end(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # where the verification command runs, as a user types it
    runs, steps = planted_tables(repeats=2, steps=20)
    results = _write_results(tmp_path / name, runs, steps, config=True)
    out = tmp_path / name / "verify.yaml"
    assert advise_cli.main([str(results), "--out", str(out), "--boot", "4", "--steps", "200"]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    # The advice first, its prediction and gain, then the command that verifies it with the
    # config just written; the model's parameters only with --details.
    assert lines[0] == (
        "advice for 16 cores per rank: policy none, 13 workers, launch roles not pinned, "
        "loader.handoff torch"
    )
    assert lines[1].startswith("predicted: ") and "samples/s per rank" in lines[1]
    assert lines[2].startswith("predicted gain: ")
    assert f"  snakemake --profile profiles/local --configfile {shlex.quote(str(out))}" in lines
    assert "kappa" not in printed and adv.DETAILS_RULE not in printed
    assert lines[-1] == adv.DETAILS_HINT
    plan = load_plan(out)
    # The best measured setting is re-run beside the advice unless the advice covers it.
    best = adv.best_measured(mdl.run_data(runs, steps))
    covered = best.policy == "none" and best.workers in (11, 13, 15)
    expected = {"advice", "policies", "loader"} | (set() if covered else {"best"})
    assert set(plan.experiments()) == expected
    assert {s.steps.measured for s in plan.specs.values()} == {200}


def test_details_and_the_text_record_hold_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs, steps = planted_tables(repeats=2, steps=20)
    results = _write_results(tmp_path / "r", runs, steps, config=True)
    text = tmp_path / "advice.txt"
    assert advise_cli.main([str(results), "--boot", "4", "--text", str(text)]) == 0
    short = capsys.readouterr().out
    assert advise_cli.main([str(results), "--boot", "4", "--details"]) == 0
    full = capsys.readouterr().out
    # --details prints the summary unchanged, then the model under a rule; --text keeps the
    # details whatever --details says (the file is the advice's record).
    summary, rule, details = full.partition(f"\n{adv.DETAILS_RULE}\n")
    assert rule and short.startswith(summary)
    assert text.read_text() == full
    for name in ("rate", "kappa", "compute", "k0", "handoff_ms", "best per policy", "fit notes"):
        assert name in details
    assert "kappa: loader workers one core keeps busy" in details
    # The fit's notes are the details'; the advice's own notes are the summary's.
    fit = mdl.fit(mdl.run_data(runs, steps), cores=CORES, boot=0)
    assert fit.notes and not any(n in summary for n in fit.notes)
    assert all(n in details for n in fit.notes)


def test_the_verification_command_from_outside_the_checkout_goes_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs, steps = planted_tables(repeats=1, steps=10)
    results = _write_results(tmp_path / "r", runs, steps, config=True)
    monkeypatch.chdir(tmp_path)  # no profiles/local here
    assert advise_cli.main(["r", "--boot", "0", "--out", "v.yaml"]) == 0
    command = (
        f"  cd {shlex.quote(str(REPO))} && snakemake --profile profiles/local --configfile "
        f"{shlex.quote(str(tmp_path / 'v.yaml'))}"
    )
    assert command in capsys.readouterr().out.splitlines()
    assert (tmp_path / "v.yaml").is_file() and results.is_dir()


@pytest.mark.parametrize(
    ("value", "lo", "hi", "scale", "words"),
    [
        (0.8465, 0.5777, 1.577, 0.0, "0.5777 to 1.577"),
        # The issue's interval: a k no combined run set, refitted anywhere up to 1.15e4.
        (0.2438, 0.0, 1.15e4, 0.1, "not determined by these runs (the refits spread it wider"),
        (4093.0, 3291.0, math.inf, 0.0, "(some refits leave it unbounded: 3291 to none)"),
        (1.0, math.nan, math.nan, 0.0, "not determined by these runs (no refit identified it)"),
        # A parameter that may be 0 is bounded, not spread, by a small interval around 0.
        (0.0, 0.0, 0.05631, 0.1, "0 to 0.05631"),
        (0.0, 0.0, 33.62, 3.0, "not determined"),
    ],
)
def test_an_interval_that_says_nothing_is_not_shown_as_one(
    value: float, lo: float, hi: float, scale: float, words: str
) -> None:
    assert words in adv.interval_words(value, lo, hi, fmt=".4g", scale=scale)


def test_the_gain_is_the_advice_against_the_best_measured_setting() -> None:
    # Without combined runs at 13-16 workers under `none` the best measured setting is
    # `isolated` at 8 workers (its compute capacity, 3200); the advice (`none`, 13) is
    # predicted at `none`'s 3500: +9 %, and the paired interval holds it.
    runs, steps = planted_tables(repeats=2, steps=20, combined_workers=(4, 8, 24, 32, 48))
    data = mdl.run_data(runs, steps)
    fit = mdl.fit(data, cores=CORES, boot=20, seed=0)
    a = adv.advise(fit, cores=CORES)
    best = adv.best_measured(data)
    gain = adv.predicted_gain(fit, a, best)
    assert gain is not None and not gain.same
    assert (best.policy, best.workers) == ("isolated", 8)
    assert gain.gain == pytest.approx(3500 / 3200 - 1, abs=0.02)
    assert gain.lo <= gain.gain <= gain.hi and gain.lo > 0
    line = adv.gain_line(gain)
    assert line.startswith(f"predicted gain: +{100 * gain.gain:.1f} % (95 % interval +")
    assert "over the best setting measured (policy isolated, 8 workers" in line
    # The advice measured itself: no gain, said so.
    same = adv.predicted_gain(fit, a, replace(best, policy="none", workers=a.workers))
    assert same is not None and same.same
    assert adv.gain_line(same).startswith("predicted gain: none: the advice is the best setting")
    # On one plateau with the advice: none, and how the advice differs.
    plateau = adv.predicted_gain(fit, a, replace(best, policy="none", workers=15))
    assert plateau is not None
    assert adv.gain_line(plateau).startswith("predicted gain: none over the best setting")
    assert "the advice uses 2 workers fewer" in adv.gain_line(plateau)


def test_main_cross_validates_and_writes_the_held_out_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs, steps = planted_tables(repeats=2, steps=20)
    results = _write_results(tmp_path / "r", runs, steps, config=True)
    cv = tmp_path / "out" / "cv.csv"
    assert advise_cli.main([str(results), "--boot", "0", "--cross-validate", str(cv)]) == 0
    printed = capsys.readouterr().out
    assert "in sample (the " in printed and "out of sample (each combined worker count" in printed
    table = pd.read_csv(cv)
    combined = runs[runs["mode"] == "data+compute"]
    assert sorted(table["run_id"]) == sorted(combined["run_id"])
    # Planted data with 2 % step noise: every held-out run is predicted within 5 %.
    assert table["error"].abs().max() < 0.05


def test_main_without_config_rebuilds_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs, steps = planted_tables(repeats=1, steps=20)
    results = _write_results(tmp_path / "r", runs, steps, config=False)
    out = tmp_path / "verify.yaml"
    assert advise_cli.main([str(results), "--out", str(out), "--boot", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--fit-cores" in err
    assert (
        advise_cli.main([str(results), "--fit-cores", "16", "--out", str(out), "--boot", "0"]) == 0
    )
    spec = next(iter(load_plan(out).specs.values()))
    assert spec.workload.batch_size == BATCH


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("no_dir", "tables/runs.csv: missing table"),
        ("no_steps", "tables/steps.csv.gz: missing table"),
        ("no_column", "runs.csv: missing column(s) ['policy']"),
        ("no_data_runs", "no data-mode runs"),
        ("bad_config", "config.yaml: "),
        ("stale_config", "verification config invalid: "),
    ],
)
def test_main_errors_are_one_line(
    tmp_path: Path, damage: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    runs, steps = planted_tables(repeats=1, steps=10)
    if damage == "no_column":
        runs = runs.drop(columns="policy")
    if damage == "no_data_runs":
        runs = runs[runs["mode"] != "data"]
    root = tmp_path / "results"
    if damage != "no_dir":
        _write_results(root, runs, steps, config=True)
    if damage == "no_steps":
        (root / "tables" / "steps.csv.gz").unlink()
    if damage == "bad_config":
        (root / "config.yaml").write_text("defaults: [unclosed\n")
    out = []
    if damage == "stale_config":
        cfg = yaml.safe_load((root / "config.yaml").read_text())
        cfg["defaults"]["loader"]["no_such_key"] = 1
        (root / "config.yaml").write_text(yaml.safe_dump(cfg))
        out = ["--out", str(tmp_path / "verify.yaml")]
    assert advise_cli.main([str(root), "--boot", "0", *out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("codl advise: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_runs_as_a_codl_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from codl import cli

    assert cli.main(["advise", str(tmp_path), "--cores", "8"]) == 2
    err = capsys.readouterr().err
    assert "tables/runs.csv: missing table" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as help_exit:
        cli.main(["advise", "--help"])
    assert help_exit.value.code == 0
    assert "--cores" in capsys.readouterr().out


def test_advice_below_the_fitted_budgets_says_it_is_pessimistic() -> None:
    runs, steps = planted_tables(small_budget=8, repeats=1, steps=20)
    two = mdl.fit(mdl.run_data(runs, steps), cores=CORES, boot=0)
    assert two.budgets == (8, CORES)
    below = adv.advise(two, cores=6)
    assert any("6 cores is below every fitted budget (8)" in n for n in below.notes)
    assert not any("below every fitted budget" in n for n in adv.advise(two, cores=8).notes)


def _with_ring(speedup: float = 1.2) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The planted torch runs, plus the same loading runs as `ring` runs whose steps are
    ``speedup`` times faster; the compute twins serve both."""
    runs, steps = planted_tables()
    loads = runs["mode"] != "compute"
    runs = runs.assign(handoff=runs["mode"].where(~loads, "torch").where(loads, None))
    ring = runs[loads].assign(handoff="ring", run_id=lambda r: r["run_id"] + "-ring")
    ring["throughput_samples_s"] *= speedup
    ring_steps = steps[steps["run_id"].isin(runs.loc[loads, "run_id"])].copy()
    ring_steps["run_id"] += "-ring"
    ring_steps["step_ms"] /= speedup
    return pd.concat([runs, ring], ignore_index=True), pd.concat([steps, ring_steps])


def test_the_advisor_fits_one_hand_off_and_takes_the_faster() -> None:
    runs, steps = _with_ring()
    r, s, chosen = adv.choose_handoff(runs, steps)
    assert chosen.handoff == "ring"
    assert set(r["handoff"].dropna()) == {"ring"}
    assert (r["mode"] == "compute").sum() == (runs["mode"] == "compute").sum()  # twins kept
    assert set(s["run_id"]) == set(r["run_id"])
    fit = mdl.fit(mdl.run_data(r, s), cores=CORES, boot=0)
    # The ring has no pin-memory thread: one launch role fewer than torch's pinned loader.
    assert fit.node.handoff == "ring"
    assert fit.node.roles("data+compute") == 2
    a = adv.advise(fit, cores=CORES, handoff=chosen)
    assert a.handoff == "ring"
    assert any("loader.handoff ring" in n for n in a.notes)
    cfg = adv.verification_config(a, fit, defaults={"device": "cuda"})
    assert cfg["defaults"]["loader"]["handoff"] == "ring"
    loading = [s for s in build_plan(cfg).specs.values() if s.mode.loads]
    assert loading and all(s.loader.handoff.value == "ring" for s in loading)
    # Asked for, the slower hand-off is fitted; one the tables lack is refused in one line.
    assert adv.choose_handoff(runs, steps, handoff="torch")[2].handoff == "torch"
    with pytest.raises(mdl.ModelError, match="no loading run with it"):
        adv.choose_handoff(runs[runs["handoff"] != "ring"], steps, handoff="ring")
    # Pooled hand-offs are refused by the model itself.
    with pytest.raises(mdl.ModelError, match="one hand-off at a time"):
        mdl.run_data(runs, steps)
    # So are runs at two workers' priorities: the model has no term for it.
    niced = r.assign(worker_nice=[0 if i % 2 else 19 for i in range(len(r))])
    niced.loc[niced["mode"] != "data+compute", "worker_nice"] = None
    with pytest.raises(mdl.ModelError, match=r"loader.worker_nice \[0, 19\]"):
        mdl.run_data(niced, s)
    mdl.run_data(niced.assign(worker_nice=19), s)  # one priority: fitted


def test_advice_on_torchs_pinned_loader_points_at_the_ring_when_compute_inflates(
    fit: mdl.Fit,
) -> None:
    a = adv.advise(fit, cores=CORES)
    pointed = any("loader.handoff: ring" in n for n in a.notes)
    assert a.handoff == "torch"
    assert pointed == (a.inflation > adv.GIL_NOTE_INFLATION)
    # Past the loader's cores the planted model inflates compute: there the note must appear.
    crowded = adv.advise(fit, cores=CORES, max_workers=32, policies=["none"], tie=0.0)
    grid = crowded.grid
    worst = grid.loc[grid["inflation"].idxmax()]
    assert float(worst["inflation"]) > adv.GIL_NOTE_INFLATION


def test_ring_advice_with_more_workers_than_loader_cores_points_at_the_workers_nice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def pick(workers: int, loader_cores: float) -> pd.Series:
        return pd.Series({"workers": workers, "loader_cores": loader_cores})

    assert adv.nice_note("ring", pick(24, 14.0))
    assert "loader.worker_nice: 19" in adv.nice_note("ring", pick(24, 14.0))[0]
    assert adv.nice_note("ring", pick(12, 14.0)) == []
    assert adv.nice_note("ring", pick(14, 14.0)) == []
    assert adv.nice_note("ring", pick(4, float("nan"))) == []
    # Torch's loader never gets it: its inflation is the GIL's, which the priority leaves alone.
    assert adv.nice_note("torch", pick(24, 14.0)) == []
    # In the advice: what the rule says of the advised setting is among its notes.
    runs, steps = _with_ring()
    r, s, chosen = adv.choose_handoff(runs, steps)
    fit = mdl.fit(mdl.run_data(r, s), cores=CORES, boot=0)
    seen: list[tuple[str, int]] = []

    def rule(handoff: str, pick: pd.Series) -> list[str]:
        seen.append((handoff, int(pick["workers"])))
        return ["the rule's note"]

    monkeypatch.setattr(adv, "nice_note", rule)
    a = adv.advise(fit, cores=CORES, handoff=chosen)
    assert "the rule's note" in a.notes
    assert seen == [("ring", a.workers)]
