"""Blocks in the plan and the workflow, and repeats planned from measured scatter.

A block is one repeat of every run, made back to back: `codl plan` lists the order, the
Snakefile chains a block's runs in it and groups them into one Slurm job (dry-run below), and
`codl plan --target-ci` says how many blocks a target interval needs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from codl.analysis.repeats import plan_repeats, repeats_needed
from codl.cli import main
from codl.config import analysed_blocks, block_progress, block_slots, build_plan, plan_blocks
from codl.errors import ConfigError
from test_workflow import snakemake

BASE: dict[str, Any] = {
    "defaults": {
        "workload": {"batch_size": 4, "image_size": 32},
        "dataset": {"name": "blk-jpeg", "samples": 16, "height": 32, "width": 32},
        "loader": {"workers": 1},
        "steps": {"warmup": 1, "measured": 2},
    },
    "experiments": [
        {"name": "e", "factors": {"mode": ["compute", "data", "combined"]}, "repeats": 3}
    ],
}


def _cfg(**blocks: Any) -> dict[str, Any]:
    return {**BASE, "blocks": blocks} if blocks else dict(BASE)


def test_abba_runs_each_repeat_as_a_block_reversed_every_other_time() -> None:
    cfg = _cfg(order="abba")
    plan = build_plan(cfg)
    blocks = plan_blocks(cfg, plan)
    assert [b.name for b in blocks] == ["block0", "block1", "block2"]
    modes = [[plan.specs[r].mode.value for r in b.run_ids] for b in blocks]
    assert modes == [
        ["compute", "data", "combined"],
        ["combined", "data", "compute"],
        ["compute", "data", "combined"],
    ]
    # Every run once, each block one repeat: a run and its twins always share a block.
    assert sorted(r for b in blocks for r in b.run_ids) == sorted(plan.specs)
    for b in blocks:
        assert {plan.specs[r].repeat for r in b.run_ids} == {b.index}
    slots = block_slots(blocks)
    assert slots[blocks[1].run_ids[0]].previous is None
    assert slots[blocks[1].run_ids[2]].previous == blocks[1].run_ids[1]
    assert plan_blocks(_cfg(), plan) == ()


def test_shuffle_is_drawn_from_the_recorded_seed() -> None:
    plan = build_plan(_cfg(order="shuffle", seed=7))
    first = plan_blocks(_cfg(order="shuffle", seed=7), plan)
    assert first == plan_blocks(_cfg(order="shuffle", seed=7), plan)
    assert [b.seed for b in first] == ["7:0", "7:1", "7:2"]
    # Some seed orders some block differently (a shuffle that never moves would pass vacuously).
    others = {
        tuple(tuple(b.run_ids) for b in plan_blocks(_cfg(order="shuffle", seed=s), plan))
        for s in range(8)
    }
    assert len(others) > 1


def test_blocks_default_to_off_and_their_order_to_abba() -> None:
    # The schema's defaults: an empty section (the default) plans no blocks; a section that
    # names only a seed orders ABBA; an order that does not exist is refused by name.
    cfg = {**BASE, "blocks": {}}
    assert plan_blocks(cfg, build_plan(cfg)) == ()
    seeded = {**BASE, "blocks": {"seed": 1}}
    abba = {**BASE, "blocks": {"order": "abba"}}
    assert plan_blocks(seeded, build_plan(seeded)) == plan_blocks(abba, build_plan(abba))
    with pytest.raises(ConfigError, match=r"blocks\.order"):
        build_plan({**BASE, "blocks": {"order": "random"}})


def test_codl_plan_lists_the_runs_block_by_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "blocks.yaml"
    config.write_text(yaml.safe_dump(_cfg(order="abba")))
    assert main(["plan", str(config), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["block"], r["mode"]) for r in rows[:6]] == [
        ("block0", "compute"),
        ("block0", "data"),
        ("block0", "combined"),
        ("block1", "combined"),
        ("block1", "data"),
        ("block1", "compute"),
    ]


@pytest.mark.slow
def test_slurm_dry_run_submits_each_block_as_one_job_in_its_order(tmp_path: Path) -> None:
    cfg = _cfg(order="abba")
    config = tmp_path / "blocks.yaml"
    config.write_text(yaml.safe_dump(cfg))
    plan = build_plan(cfg)
    log, _ = snakemake(tmp_path / "work", config, "--dry-run", profile="slurm")
    # Snakemake prints each group job with its member jobs; a run lists its block predecessor's
    # trace among its inputs.
    groups = re.findall(r"Group job (block\d+)", log)
    assert sorted(groups) == ["block0", "block1", "block2"]
    pattern = r"rule run:\n\s+input: ([^\n]*)\n\s+output: results/runs/(\w+)/trace.h5"
    inputs = {run: inp for inp, run in re.findall(pattern, log)}
    assert len(inputs) == len(plan.specs)
    for block in plan_blocks(cfg, plan):
        for before, run in zip(block.run_ids, block.run_ids[1:], strict=False):
            assert f"results/runs/{before}/trace.h5" in inputs[run]
        assert "/trace.h5" not in inputs[block.run_ids[0]]


def test_repeats_needed_matches_the_t_interval_it_plans() -> None:
    n = repeats_needed(0.06, 1.44, 5.0)
    assert n is not None
    t = {k: __import__("scipy").stats.t.ppf(0.975, k - 1) for k in (n - 1, n)}
    width = {k: 100 * 1.44 * math.expm1(t[k] * 0.06 / math.sqrt(k)) for k in t}
    assert width[n] <= 5.0 < width[n - 1]
    assert repeats_needed(math.nan, 1.4, 5.0) is None


def _pilot(sd: float, blocks: int, seed: int = 0) -> pd.DataFrame:
    """A pilot's runs table: each block a compute run and a combined run 30 % slower, the
    block's log ratio scattering ``sd`` (planted), 50 steps of 100 ms."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(blocks):
        drift = rng.normal(0, 0.2)  # machine state shared by the block: pairing removes it
        noise = rng.normal(0, sd)
        for mode, value in (("compute", 10.0), ("combined", 13.0 * math.exp(noise))):
            rows.append(
                {
                    "run_id": f"{mode}-{b}",
                    "mode": mode,
                    "device": "cuda",
                    "model": "resnet50",
                    "batch_size": 128,
                    "policy": "none",
                    "workers": 4 if mode == "combined" else 0,
                    "prefetch_factor": 2 if mode == "combined" else None,
                    "pin_memory": True if mode == "combined" else None,
                    "nodes": 1,
                    "ranks_per_node": 1,
                    "world_size": 1,
                    "repeat": b,
                    "host": "gpu1",
                    "steps": 50,
                    "step_ms_mean": 100.0,
                    "compute_eff_ms_mean": value * math.exp(drift),
                }
            )
    return pd.DataFrame(rows)


def test_planned_repeats_follow_the_planted_scatter(tmp_path: Path) -> None:
    small = plan_repeats(_pilot(0.02, 12), 5.0)
    large = plan_repeats(_pilot(0.10, 12), 5.0)
    row_s = small[small["component"] == "compute"].iloc[0]
    row_l = large[large["component"] == "compute"].iloc[0]
    assert row_s["paired"] and row_s["n_blocks"] == 12
    assert row_s["ratio"] == pytest.approx(1.3, rel=0.03)
    # The planted 0.10 is recovered (12 blocks: within 40 %), not the 0.2 drift pairing removes.
    assert 0.06 < row_l["sd_log"] < 0.14
    assert row_l["repeats"] > 4 * row_s["repeats"]
    # One run and one twin of 5 s each per block.
    assert row_l["device_h"] == pytest.approx(row_l["repeats"] * 10 / 3600)


def test_codl_plan_target_ci_prints_the_repeats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(BASE))
    pilot = tmp_path / "pilot"
    pilot.mkdir()
    _pilot(0.05, 6).to_csv(pilot / "runs.csv", index=False)
    args = ["plan", str(config), "--target-ci", "5", "--pilot", str(pilot)]
    assert main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["component"] for r in rows] == ["compute"]
    assert rows[0]["repeats"] == repeats_needed(rows[0]["sd_log"], rows[0]["ratio"], 5.0)
    assert main(["plan", str(config), "--target-ci", "5", "--pilot", str(tmp_path / "no")]) == 2
    assert "no runs table" in capsys.readouterr().err


# A `blocks:` section each way it can be wrong: one line naming the key and what was expected,
# from the plan, from plan_blocks given a config nobody checked, and from `codl plan`.
BAD_BLOCKS: list[tuple[str, Any, str]] = [
    ("a number", 3, "blocks: got 3, expected a mapping"),
    ("a list", ["abba"], "blocks: got ['abba'], expected a mapping"),
    ("a word", "abba", "blocks: got 'abba', expected a mapping"),
    ("YAML yes", True, "blocks: got true (YAML reads yes/no/on/off as true/false), expected a"),
    (
        "unknown key",
        {"sed": 1},
        "blocks.sed: unknown key, expected one of ['budget', 'order', 'per_invocation', 'seed']",
    ),
    ("a number as a key", {1: 2}, "blocks.1: unknown key"),
    ("unknown order", {"order": "abab"}, "blocks.order: got 'abab', expected one of"),
    ("budget a word", {"budget": "soon"}, "blocks.budget: got 'soon', expected seconds"),
    ("order as a number", {"order": 3}, "blocks.order: got 3, expected one of"),
    ("order empty", {"order": None}, "blocks.order: got null, expected one of"),
    ("negative seed", {"seed": -1}, "blocks.seed: -1 is less than the minimum of 0"),
    ("seed past 2^31", {"seed": 2**31}, "blocks.seed: 2147483648 is greater than the maximum"),
    ("seed NaN", {"seed": math.nan}, "blocks.seed: got nan, expected an integer from 0 to"),
    ("seed inf", {"order": "shuffle", "seed": math.inf}, "blocks.seed: got inf, expected"),
    ("seed a fraction", {"seed": 1.5}, "blocks.seed: got 1.5, expected an integer"),
    ("seed 2.0", {"seed": 2.0}, "blocks.seed: got 2.0, expected an integer"),
    ("seed a word", {"seed": "seven"}, "blocks.seed: got 'seven', expected an integer"),
    ("seed a quoted number", {"seed": "7"}, "blocks.seed: got '7', expected an integer"),
    ("seed YAML yes", {"seed": True}, "blocks.seed: got true (YAML reads"),
    ("seed a list", {"seed": [1]}, "blocks.seed: got [1], expected an integer"),
    ("no block per invocation", {"per_invocation": 0}, "blocks.per_invocation: 0 is less than"),
    ("per_invocation NaN", {"per_invocation": math.nan}, "blocks.per_invocation: got nan"),
    ("per_invocation a word", {"per_invocation": "two"}, "blocks.per_invocation: got 'two'"),
    ("per_invocation 1.5", {"per_invocation": 1.5}, "blocks.per_invocation: got 1.5"),
]


@pytest.mark.parametrize(
    ("section", "expected"), [c[1:] for c in BAD_BLOCKS], ids=[c[0] for c in BAD_BLOCKS]
)
def test_a_bad_blocks_section_is_refused_by_name(
    section: Any, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = {**BASE, "blocks": section}
    with pytest.raises(ConfigError) as info:
        build_plan(cfg)
    assert len(info.value.problems) == 1, info.value.problems
    assert info.value.problems[0].startswith(expected), info.value.problems
    with pytest.raises(ConfigError) as unchecked:
        plan_blocks(cfg, build_plan(BASE))
    assert unchecked.value.problems == info.value.problems
    config = tmp_path / "blocks.yaml"
    config.write_text(yaml.safe_dump(cfg))
    assert main(["plan", str(config)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err


def test_an_invocation_analyses_the_measured_blocks_and_at_most_per_invocation_more() -> None:
    cfg = {**BASE, "experiments": [{**BASE["experiments"][0], "repeats": 4}]}
    blocks = plan_blocks({**cfg, "blocks": {"order": "abba"}}, build_plan(cfg))
    assert len(blocks) == 4

    def measured(*done: int, half: int | None = None) -> Callable[[str], bool]:
        ids = {rid for b in done for rid in blocks[b].run_ids}
        if half is not None:
            ids.add(blocks[half].run_ids[0])
        return ids.__contains__

    def picked(per: int | None, seen: Callable[[str], bool]) -> list[int]:
        section = {"order": "abba", **({} if per is None else {"per_invocation": per})}
        return [b.index for b in analysed_blocks({"blocks": section}, blocks, seen)]

    assert picked(None, measured()) == [0, 1, 2, 3]
    assert picked(1, measured()) == [0]
    assert picked(1, measured(0)) == [0, 1]
    assert picked(2, measured(0, 2)) == [0, 1, 2, 3]
    # A block a failed invocation left half-measured is finished before a new one starts.
    assert picked(1, measured(0, half=1)) == [0, 1]
    rows = block_progress(
        blocks, analysed_blocks({"blocks": {"per_invocation": 1}}, blocks, measured(0))
    )
    assert [r["analysed"] for r in rows] == [True, True, False, False]
    assert [r["block"] for r in rows] == ["block0", "block1", "block2", "block3"]
