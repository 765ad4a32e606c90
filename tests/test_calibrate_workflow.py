"""Calibration in the workflow (``advisor.calibrate``, docs/advisor.md "Calibration on a new
machine"): the fit of another machine (planted: 16 cores, launch roles' CPU time in its steps
table, a CPU workload in its config), probed on this machine's 2 cores by real runs that
Snakemake plans from the fit, then calibrated and advised in one unit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from codl import cli
from codl.advisor import calibrate as cal
from codl.advisor import model as mdl
from codl.advisor.verify import file_sha256
from codl.config import build_plan, load_yaml
from codl.errors import ConfigError
from codl.paths import ResultPaths
from codl.steps.advisor import fit_results, probe_workflow_config
from test_model import CORES, occupied_tables
from test_workflow import snakemake

# The probe's core budget: what this machine gives a local run (the CI VM has 2 cores).
PROBE_CORES = 2


def planted_fit(d: Path) -> Path:
    """A fit's results directory as the workflow leaves it: merged tables planted on 16 cores
    (the data runs at 16, combined runs at 8 and 16), and a config whose defaults are a tiny
    CPU workload, which the probe runs here."""
    runs_csv, steps_csv = ResultPaths.merged_tables_of(d)
    runs_csv.parent.mkdir(parents=True)
    runs, steps = occupied_tables(((4, 16), (8, 16), (16, 16), (4, 8), (8, 8), (16, 8)))
    runs.to_csv(runs_csv, index=False)
    steps.to_csv(steps_csv, index=False)
    cfg = {
        "defaults": {
            "device": "cpu",
            "workload": {"model": "resnet_tiny", "batch_size": 4, "image_size": 32},
            "dataset": {"name": "probe-tiny", "samples": 16, "height": 40, "width": 48},
            "loader": {"prefetch_factor": 1},
            "steps": {"warmup": 1, "measured": 3},
        },
        "experiments": [{"name": "planted", "factors": {"mode": ["data", "data+compute"]}}],
        "slurm": {"cpus_per_rank": CORES},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    return d


def test_the_probe_is_planned_from_the_fit_and_refuses_runs_of_its_own(tmp_path: Path) -> None:
    fit = planted_fit(tmp_path / "fit")
    cfg = {"advisor": {"calibrate": str(fit), "cores": PROBE_CORES}}
    planned = probe_workflow_config(cfg)
    # Deterministic (the fit's point estimates only), and the config `--probe-out` writes.
    assert planned == probe_workflow_config(cfg)
    out = tmp_path / "probe.yaml"
    args = ["advise", str(fit), "--cores", str(PROBE_CORES), "--probe-out", str(out)]
    assert cli.main(args) == 0
    written = build_plan(load_yaml(out)).specs
    assert list(build_plan(planned).specs) == list(written)
    assert planned["slurm"]["cpus_per_rank"] == PROBE_CORES
    # A verification run never has a probe run's spec (the workflow would reuse the run).
    assert planned["defaults"]["seed"] == cal.PROBE_SEED_OFFSET
    for clash in ({"experiments": [{"name": "x"}]}, {"advisor": {"advise": True}}):
        bad = {**cfg, **clash, "advisor": {**cfg["advisor"], **clash.get("advisor", {})}}
        with pytest.raises(ConfigError, match=r"advisor\.calibrate: got"):
            probe_workflow_config(bad)


def test_codl_plan_plans_the_probe_the_workflow_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fit = planted_fit(tmp_path / "fit")
    cfg = {"advisor": {"calibrate": str(fit), "cores": PROBE_CORES}}
    path = tmp_path / "calibrate.yaml"
    path.write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    assert cli.main(["plan", str(path), "--json"]) == 0
    listed = [row["run_id"] for row in json.loads(capsys.readouterr().out)]
    assert listed == list(build_plan(probe_workflow_config(cfg)).specs)
    # What the workflow refuses, `codl plan` refuses, naming the file.
    path.write_text(yaml.safe_dump({**cfg, "experiments": [{"name": "x"}]}))
    assert cli.main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "advisor.calibrate: got experiments too" in err


def test_calibrate_refuses_a_probe_results_without_the_probes_runs(tmp_path: Path) -> None:
    fit = planted_fit(tmp_path / "fit")
    probe = tmp_path / "probe.yaml"
    assert cli.main(["advise", str(fit), "--boot", "0", "--probe-out", str(probe)]) == 0
    # The fit's own tables are not the probe's runs: refused, naming the option, nothing written.
    out = tmp_path / "verify.yaml"
    args = ["advise", str(fit), "--boot", "0", "--calibrate", str(fit), "--out", str(out)]
    assert cli.main([*args, "--probe-config", str(probe)]) == 2
    assert not out.exists()
    # The probe's options need --calibrate; refused before anything is fitted.
    for option in ("--probe-config", "--calibration-table"):
        assert cli.main(["advise", str(fit), option, str(tmp_path / "x")]) == 2
    # --text holds what is printed, written with the other outputs.
    text = tmp_path / "advice.txt"
    assert (
        cli.main(["advise", str(fit), "--boot", "0", "--out", str(out), "--text", str(text)]) == 0
    )
    assert "advice for 16 cores per rank" in text.read_text() and out.is_file()


@pytest.mark.slow
def test_the_workflow_probes_calibrates_and_advises(tmp_path: Path) -> None:
    fit = planted_fit(tmp_path / "fit")
    work = tmp_path / "work"
    work.mkdir()
    config = tmp_path / "calibrate.yaml"
    config.write_text(yaml.safe_dump({"advisor": {"calibrate": str(fit), "cores": PROBE_CORES}}))
    paths = ResultPaths(root=work, set_name="calibrate")
    rel = ResultPaths(set_name="calibrate")
    targets = [rel.advice_text, rel.verify_config, rel.predictions_table, rel.calibration_table]
    _, jobs = snakemake(work, config, *map(str, targets))
    assert jobs["run"] == 3 and jobs["probe_config"] == 1 and jobs["calibrate"] == 1

    # The runs Snakemake planned at parse time are those of the probe config the rule wrote.
    probe_ids = set(build_plan(load_yaml(paths.probe_config)).specs)
    runs = pd.read_csv(paths.runs_table)
    steps = pd.read_csv(paths.steps_table)
    assert set(runs["run_id"]) == probe_ids
    # The probe's table holds what the runs measured, per configuration: the delivered rate,
    # or the workers' production where a data run's window drained batches made before it (on
    # a loaded machine it can: the model's `drained`).
    table = pd.read_csv(paths.calibration_table)
    probe = mdl.run_data(runs, steps)
    modes = runs.set_index("run_id")["mode"]
    measured = pd.Series({modes[r]: mdl.measured_throughput(probe, r) for r in modes.index})
    assert np.allclose(table.set_index("mode")["measured"], measured.reindex(table["mode"]))
    delivered = runs.set_index("run_id")["throughput_samples_s"]
    kept = [r for r in modes.index if r not in probe.drained]
    assert any(modes[r] != "data" for r in kept)
    assert np.allclose(measured[modes[kept]], delivered[kept])

    # The advice and its predictions are the model calibrated on those runs, not the fit's.
    uncalibrated = fit_results(fit, boot=0).fit
    c = cal.calibrate(uncalibrated, mdl.run_data(runs, steps), cores=PROBE_CORES)
    predictions = pd.read_csv(paths.predictions_table)
    settings = predictions[["policy", "workers"]].assign(cores=PROBE_CORES)
    after = mdl.predict(c.fit, settings)["throughput"].to_numpy()
    before = mdl.predict(uncalibrated, settings)["throughput"].to_numpy()
    assert np.allclose(predictions["throughput"], after, rtol=1e-6)
    assert not np.allclose(predictions["throughput"], before, rtol=0.05)
    text = paths.advice_text.read_text()
    assert f"calibration on {rel.results}" in text and "calibrated on 3 probe" in text
    # The predictions' hash is in the verification config, whose runs are all new.
    verify = load_yaml(paths.verify_config)
    assert verify["advisor"]["predictions_sha256"] == file_sha256(paths.predictions_table)
    assert not set(build_plan(verify).specs) & probe_ids
