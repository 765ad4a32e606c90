"""The `pooled` rule on real CPU runs: a two-block experiment reduced by the workflow alone, with
data alone in every block so that each loading run has its roofline."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from codl.analysis.efficiency import LOST_COLUMNS
from codl.config import build_plan
from codl.paths import FIGURE_FORMATS, ResultPaths
from test_workflow import snakemake

pytestmark = pytest.mark.slow

POLICIES = ["none", "isolated"]
CONFIG = {
    "name": "pooled-cpu",
    "defaults": {
        "workload": {"batch_size": 4, "image_size": 32},
        "dataset": {"name": "pool-jpeg", "samples": 32, "height": 40, "width": 48},
        "loader": {"workers": 2},
        "steps": {"warmup": 1, "measured": 3},
    },
    "experiments": [
        {
            "name": "gil",
            "factors": {
                "mode": ["compute", "data", "data+compute"],
                "pinning.policy": POLICIES,
            },
            "repeats": 2,
        }
    ],
    "blocks": {"order": "abba"},
}


def test_the_pooled_rule_pairs_every_loading_run_inside_its_block(tmp_path: Path) -> None:
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(CONFIG))
    paths = ResultPaths(workdir, set_name=CONFIG["name"])
    targets = [
        paths.pooled_inflation_table,
        paths.pooled_runs_table,
        paths.intervention_figure(),
        paths.pooled_efficiency_table,
    ]
    _, jobs = snakemake(workdir, cfg_path, *(str(t.relative_to(workdir)) for t in targets))
    # compute, data and data+compute under two policies, twice (compute alone has no loader,
    # its policy still tells its runs apart).
    assert jobs["run"] == len(build_plan(CONFIG).specs) == 12 and jobs["pooled"] == 1

    runs = pd.read_csv(paths.pooled_runs_table)
    assert len(runs) == 12 and sorted(set(runs["repeat"])) == [0, 1]
    table = pd.read_csv(paths.pooled_inflation_table)
    assert sorted(table["policy"]) == sorted(POLICIES)  # one row per loading setting
    for _, row in table.iterrows():
        assert row["n_blocks"] == 2 and row["n_runs"] == 4 and row["n_unpaired"] == 0
        assert math.isfinite(row["inflation"])
        assert row["inflation_lo"] <= row["inflation"] <= row["inflation_hi"]
        assert len(str(row["per_block"]).split()) == 2
    versus = pd.read_csv(paths.pooled_throughput_table)
    assert versus.empty and "ring_over_best_torch" in versus  # no ring runs: columns only
    roofline = pd.read_csv(paths.pooled_efficiency_table)
    assert sorted(roofline["policy"]) == sorted(POLICIES)
    for _, row in roofline.iterrows():
        assert row["n_blocks"] == 2 and row["n_missing"] == 0
        assert row["efficiency_lo"] <= row["efficiency"] <= row["efficiency_hi"]
        assert row["limiting_part"].split()[0] in ("data", "compute", "mixed")
        parts = sum(0.0 if math.isnan(row[c]) else row[c] for c in LOST_COLUMNS)
        assert parts == pytest.approx(row["lost_ms"])
    for fmt in FIGURE_FORMATS:
        assert paths.intervention_figure(fmt).stat().st_size > 1000
        assert paths.efficiency_figure(fmt).stat().st_size > 1000
    assert "wrote " in paths.log("pooled").read_text()
