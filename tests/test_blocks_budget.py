"""`blocks.budget`: after it no new block starts in an invocation of the workflow; the
analysis holds the complete blocks so far and says how many of the planned ones ran; the next
invocation adds blocks and pools them again."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from codl.config import block_budget, block_progress, build_plan, plan_blocks
from codl.errors import ConfigError
from codl.paths import ResultPaths
from codl.steps.blocks import (
    block_progress_to,
    block_start_after,
    block_start_to,
    block_started,
    held_line,
    invocation_line,
)
from test_workflow import CONFIG, snakemake

BASE: dict[str, Any] = {
    "defaults": CONFIG["defaults"],
    "experiments": [
        {"name": "pair", "factors": {"mode": ["compute", "data+compute"]}, "repeats": 2}
    ],
}


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90.0),
        (0, 0.0),
        (2.5, 2.5),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        (" 1d 2h ", 93600.0),
    ],
)
def test_a_budget_is_seconds_or_a_duration_with_units(value: Any, seconds: float) -> None:
    cfg = {**BASE, "blocks": {"budget": value}}
    build_plan(cfg)
    assert block_budget(cfg) == seconds
    assert block_budget(BASE) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("soon", "blocks.budget: got 'soon', expected seconds >= 0 or a duration such as"),
        ("30 minutes", "blocks.budget: got '30 minutes', expected seconds >= 0 or a duration"),
        ("", "blocks.budget: got '', expected seconds >= 0"),
        (-1, "blocks.budget: -1 is less than the minimum of 0"),
        (True, "blocks.budget: got true (YAML reads"),
        (float("nan"), "blocks.budget: got nan, expected a finite number"),
        ([30], "blocks.budget: got [30], expected"),
    ],
)
def test_a_bad_budget_is_one_line_naming_the_key(value: Any, expected: str) -> None:
    cfg = {**BASE, "blocks": {"budget": value}}
    with pytest.raises(ConfigError) as info:
        build_plan(cfg)
    assert len(info.value.problems) == 1, info.value.problems
    assert info.value.problems[0].startswith(expected), info.value.problems
    with pytest.raises(ConfigError) as unchecked:
        block_budget(cfg)
    assert unchecked.value.problems == info.value.problems


def test_the_first_block_always_starts_and_a_later_one_only_before_the_deadline(
    tmp_path: Path,
) -> None:
    past = 0.0
    first = block_start_to(
        block="block0", first=True, deadline=past, budget_s=1, out=tmp_path / "a"
    )
    later = block_start_to(
        block="block1", first=False, deadline=past, budget_s=1, out=tmp_path / "b"
    )
    ahead = block_start_to(
        block="block1", first=False, deadline=float("inf"), budget_s=1, out=tmp_path / "c"
    )
    assert (first["started"], later["started"], ahead["started"]) == (True, False, True)
    assert block_started(tmp_path / "a") and not block_started(tmp_path / "b")
    assert json.loads((tmp_path / "b").read_text())["block"] == "block1"


def test_each_block_start_waits_for_the_block_before_and_the_lines_say_k_of_n(
    tmp_path: Path,
) -> None:
    cfg = {**BASE, "blocks": {"budget": "30m", "per_invocation": 2}}
    blocks = plan_blocks(cfg, build_plan(cfg))
    paths = ResultPaths(tmp_path)
    assert block_start_after(paths, blocks, "block0") == []
    assert block_start_after(paths, blocks, "block1") == [str(paths.trace(blocks[0].run_ids[-1]))]
    line = invocation_line(blocks, 0, 2, per_invocation=2, budget_s=1800.0)
    assert line == (
        "blocks: 0 of 2 planned blocks measured; this invocation may start 2 "
        "(blocks.per_invocation 2, blocks.budget 1800 s, one after another)"
    )
    rows = block_progress(blocks, blocks[:1], budget_spent=blocks[1:])
    assert [(r["analysed"], r["not_run"], r["held"]) for r in rows] == [
        (True, "", "1 of 2 planned blocks"),
        (False, "budget", "1 of 2 planned blocks"),
    ]
    table = tmp_path / "blocks.csv"
    block_progress_to(rows, table)
    assert held_line(table) == (
        f"{table}: the tables hold 1 of 2 planned blocks; 1 not started, the budget spent "
        "(blocks.budget)"
    )


def test_rotate_puts_each_loading_setting_first_in_turn_beside_its_twin_abba() -> None:
    cfg = {
        **BASE,
        "experiments": [
            {
                "name": "r",
                "factors": {"mode": ["compute", "data+compute"], "loader.workers": [1, 2, 3]},
                "repeats": 4,
            }
        ],
        "blocks": {"order": "rotate"},
    }
    plan = build_plan(cfg)
    blocks = plan_blocks(cfg, plan)

    def shown(rid: str) -> str:
        spec = plan.specs[rid]
        return f"w{spec.loader.workers}" if spec.mode.loads else "twin"

    # One compute twin shared by the three settings (it does not depend on the loader): it
    # runs once a block, beside the first setting, first in even blocks and after it in odd.
    assert [[shown(r) for r in b.run_ids] for b in blocks] == [
        ["twin", "w1", "w2", "w3"],
        ["w2", "twin", "w3", "w1"],
        ["twin", "w3", "w1", "w2"],
        ["w1", "twin", "w2", "w3"],
    ]
    assert sorted(r for b in blocks for r in b.run_ids) == sorted(plan.specs)


def jobs_ran(log: str) -> Counter[str]:
    """Jobs per rule that started: Snakemake's "Job stats" table counts only the DAG it first
    built, without the runs a checkpoint adds."""
    return Counter(re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):$", log, re.MULTILINE))


@pytest.mark.slow
def test_a_budget_stops_new_blocks_and_the_next_invocation_adds_and_pools(tmp_path: Path) -> None:
    """A 2-block plan with a budget of one second: the first block of an invocation always
    starts and takes longer than that, so exactly one block runs; the analysis holds it and
    says "1 of 2 planned blocks". The next invocation adds the second and pools both."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    cfg = {**BASE, "blocks": {"budget": "1s"}}
    cfg_path = tmp_path / "budget.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    paths = ResultPaths(workdir, set_name="budget")
    block0, block1 = (set(b.run_ids) for b in plan_blocks(cfg, build_plan(cfg)))

    out, _ = snakemake(workdir, cfg_path)
    first = jobs_ran(out)
    assert first["run"] == 2 and first["block_start"] == 2, first
    assert "blocks: 0 of 2 planned blocks measured; this invocation may start 2" in out
    assert set(pd.read_csv(paths.runs_table)["run_id"]) == block0
    assert not any(paths.trace(rid).exists() for rid in block1)
    blocks = pd.read_csv(paths.blocks_table, keep_default_na=False)
    assert list(blocks["analysed"]) == [True, False]
    assert list(blocks["not_run"]) == ["", "budget"]
    assert set(blocks["held"]) == {"1 of 2 planned blocks"}
    assert "1 of 2 planned blocks analysed (2 of 4 runs)" in paths.log("block_progress").read_text()
    assert "the tables hold 1 of 2 planned blocks; 1 not started, the budget spent" in out
    assert list(pd.read_csv(paths.pooled_inflation_table)["n_blocks"].unique()) == [1]

    out, _ = snakemake(workdir, cfg_path)
    second = jobs_ran(out)
    assert second["run"] == 2 and second["block_start"] == 1, second
    assert set(pd.read_csv(paths.runs_table)["run_id"]) == block0 | block1
    blocks = pd.read_csv(paths.blocks_table, keep_default_na=False)
    assert list(blocks["analysed"]) == [True, True]
    assert set(blocks["held"]) == {"2 of 2 planned blocks"}
    assert "2 of 2 planned blocks analysed" in paths.log("block_progress").read_text()
    assert list(pd.read_csv(paths.pooled_inflation_table)["n_blocks"].unique()) == [2]

    out, _ = snakemake(workdir, cfg_path)
    assert jobs_ran(out) == Counter(), out[-2000:]


@pytest.mark.slow
def test_under_slurm_the_budget_is_checked_where_snakemake_runs(tmp_path: Path) -> None:
    """The check is a local job (the invocation's clock), before the first block's job."""
    cfg = {**BASE, "blocks": {"budget": "30m"}}
    config = tmp_path / "budget.yaml"
    config.write_text(yaml.safe_dump(cfg))
    log, _ = snakemake(tmp_path / "work", config, "--dry-run", profile="slurm")
    assert re.search(r"^checkpoint block_start:$", log, re.MULTILINE), log[-3000:]
    assert "wildcards: block=block0" in log
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, Quietness, ResourceSettings

    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wf = api.workflow(
            resource_settings=ResourceSettings(cores=2),
            config_settings=ConfigSettings(configfiles=[config]),
            snakefile=Path(__file__).resolve().parents[1] / "workflow" / "Snakefile",
            workdir=tmp_path / "work",
        )
        # The API lists no rules; under a remote executor Workflow.is_local is this test.
        assert "block_start" in wf._workflow._localrules
    assert "DAG of jobs will be updated after completion" in log
