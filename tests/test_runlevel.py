"""Run-level intervals: honest at 2-10 runs when runs scatter more than steps do."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pandas as pd
import pytest

from codl.analysis import compare as cmp
from codl.analysis.runlevel import block_columns, block_id, log_ratio_interval, runs_blocks


def test_the_interval_covers_a_planted_ratio_at_its_level_with_three_runs() -> None:
    # 2,000 experiments of 3 blocks each; each block's ratio scatters 10 % (log-sd) around the
    # true +25 %, as per-run inflations scattered on one H200 (10 %, 34 %, 25 %).
    rng = np.random.default_rng(7)
    true = 1.25
    hits = 0
    n_exp = 2000
    for _ in range(n_exp):
        ratios = true * np.exp(rng.normal(0, 0.10, size=3))
        got = log_ratio_interval(ratios.tolist())
        hits += got.lo <= true <= got.hi
    assert 0.93 <= hits / n_exp <= 0.97


def test_two_runs_give_a_wide_interval_and_one_run_none() -> None:
    two = log_ratio_interval([1.10, 1.34])
    # t with 1 degree of freedom: "no effect" stays inside, and both runs too
    assert two.lo < 1.0 and two.hi > 1.34
    one = log_ratio_interval([1.2])
    assert one.ratio == pytest.approx(1.2) and math.isnan(one.lo) and one.n == 1
    assert "no interval" in one.as_percent()
    assert log_ratio_interval([]).n == 0


@pytest.mark.parametrize("bad", [[1.0, 0.0], [1.0, -2.0]])
def test_ratios_must_be_positive(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="positive"):
        log_ratio_interval(bad)


def test_a_block_is_one_machine_boot_and_invocation() -> None:
    attrs = {
        "host": "gpu7",
        "boot_id": "0a1b2c3d-4e5f-6789-abcd-ef0123456789",
        "invocation": "481516",
        "gpu_uuids": ["GPU-1", "GPU-2"],
        "start_unix_ns": 1_764_600_000_000_000_000,
        "spec": '{"repeat": 2}',
    }
    cols = block_columns(attrs)
    assert cols["block"] == "gpu7/0a1b2c3d/481516#2"
    assert cols["gpu_uuids"] == "GPU-1 GPU-2"
    assert cols["start_time"].startswith("2025-12-01T")
    # Another boot of the same host, or another invocation, is another block.
    # Another boot of the same host, another invocation or another repeat is another block.
    assert block_id("gpu7", "ffff0000", "481516", 2) != cols["block"]
    assert block_id("gpu7", attrs["boot_id"], "481517", 2) != cols["block"]
    assert block_id("gpu7", attrs["boot_id"], "481516", 3) != cols["block"]
    # A trace from before the attributes existed: the machine and the repeat.
    old = block_columns({"host": "gpu7", "spec": {"repeat": 0}})
    assert old["block"] == "gpu7#0" and old["boot_id"] == "" and old["start_time"] == ""
    # A runs table written before summarize wrote blocks: the host and the repeat (a float
    # where the column had a gap).
    table = pd.DataFrame({"run_id": ["a", "b"], "host": ["gpu7", "gpu8"], "repeat": [1.0, 0]})
    assert runs_blocks(table) == {"a": "gpu7#1", "b": "gpu8#0"}
    assert block_id(None) == ""


def _frames(
    run_id: str, mode: str, block: str, values: list[float], repeat: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    loads = mode == "combined"
    summary = {
        "run_id": run_id,
        "mode": mode,
        "device": "cuda",
        "model": "resnet50",
        "batch_size": 128,
        "image_size": 224,
        "precision": "bf16",
        "policy": "none",
        "launch_cores": 1,
        "nodes": 1,
        "ranks_per_node": 1,
        "backend": "nccl",
        "comm_pattern": "buckets",
        "tier": "default",
        "cupti": False,
        "cuda_api": False,
        "world_size": 1,
        "workers": 4 if loads else 0,
        "prefetch_factor": 2 if loads else None,
        "pin_memory": True if loads else None,
        "repeat": repeat,
        "host": block.split("/", maxsplit=1)[0],
        "block": block,
    }
    steps = pd.DataFrame(
        {
            "run_id": run_id,
            "step": np.arange(len(values)),
            "compute_eff_ms": values,
            "step_ms": [v + 5 for v in values],
        }
    )
    return steps, pd.DataFrame([summary])


def _compare(*runs: tuple[pd.DataFrame, pd.DataFrame]) -> pd.DataFrame:
    steps = pd.concat([s for s, _ in runs], ignore_index=True)
    runs_table = pd.concat([m for _, m in runs], ignore_index=True)
    out = cmp.compare(steps, runs_table)
    return out[(out["component"] == "compute") & (out["metric"] == "compute_eff_ms")]


def test_compare_pairs_runs_with_twins_inside_blocks() -> None:
    # Block B runs everything 50 % slower (another machine): its combined run against block
    # A's twin would read as +65 %; paired inside blocks the ratios are 2.0 and 1.1.
    out = _compare(
        _frames("x0", "combined", "a/1/j1", [20.0] * 4, repeat=0),
        _frames("c0", "compute", "a/1/j1", [10.0] * 4, repeat=0),
        _frames("x1", "combined", "b/2/j2", [33.0] * 4, repeat=1),
        _frames("c1", "compute", "b/2/j2", [30.0] * 4, repeat=1),
    ).set_index("stat")
    row = out.loc["p50"]
    assert row["status"] == "ok" and row["n_blocks"] == 2 and row["n_runs"] == 2
    assert row["run_ratio"] == pytest.approx(math.sqrt(2.0 * 1.1))
    # Two blocks: t with one degree of freedom, wide, and it holds both block ratios.
    assert row["run_ci_low"] < 1.1 and row["run_ci_high"] > 2.0
    assert row["run_diff"] == pytest.approx((10.0 + 3.0) / 2)
    # The step-level ratio of means over runs pools the blocks: (20+33)/(10+30).
    assert row["ratio"] == pytest.approx(53 / 40)


def test_a_pair_across_blocks_is_kept_but_not_ok() -> None:
    out = _compare(
        _frames("x0", "combined", "a/1/j1", [20.0, 21.0, 19.0], repeat=0),
        _frames("x1", "combined", "a/1/j1", [22.0, 20.0, 21.0], repeat=1),
        _frames("c0", "compute", "b/2/j2", [10.0, 11.0, 9.0], repeat=0),
        _frames("c1", "compute", "b/2/j2", [12.0, 10.0, 11.0], repeat=1),
    )
    assert len(out) == len(cmp.STATS)
    assert out["status"].str.startswith(cmp.ACROSS_BLOCKS).all()
    assert "a/1/j1" in out["status"].iloc[0] and "b/2/j2" in out["status"].iloc[0]
    assert (out["n_blocks"] == 0).all()
    # Kept with unpaired run-level values (Welch on logs), so a reader still sees them.
    row = out.set_index("stat").loc["p50"]
    assert row["run_ratio"] == pytest.approx(math.sqrt(20 * 21) / math.sqrt(10 * 11))
    assert row["run_ci_low"] < row["run_ratio"] < row["run_ci_high"]


# The simulation of issue 30: experiments of 3 blocks, each block one combined run and one twin
# run of 40 steps. Runs scatter around their block (log-sd RUN_SD, planted between-run
# variance) and blocks drift (log-sd DRIFT_SD, machine state both runs of a block share); steps
# scatter around their run (STEP_SD). The true ratio is TRUE on every run's median step.
TRUE, RUN_SD, DRIFT_SD, STEP_SD, STEPS, BLOCKS = 1.25, 0.10, 0.10, 0.05, 40, 3
EXPERIMENTS = 1000


def _experiment(rng: np.random.Generator) -> tuple[list[npt.NDArray], list[npt.NDArray]]:
    num, den = [], []
    for _ in range(BLOCKS):
        drift = rng.normal(0, DRIFT_SD)
        for side, level in ((num, 10.0 * TRUE), (den, 10.0)):
            run = level * math.exp(drift + rng.normal(0, RUN_SD))
            side.append(run * np.exp(rng.normal(0, STEP_SD, size=STEPS)))
    return num, den


def _two_level_p50_interval(
    num: list[npt.NDArray], den: list[npt.NDArray], *, seed: int, n: int = 400
) -> tuple[float, float]:
    """The interval compare_stats gives the p50 ratio (runs resampled, then steps within each
    picked run), computed for p50 alone: the other statistics would cost six times as long."""
    rng = np.random.default_rng(seed)
    dn = cmp.draw_indices([len(a) for a in num], n, rng)
    dd = cmp.draw_indices([len(a) for a in den], n, rng)
    f = cmp.run_statistic("p50")
    comb = cmp.replicate(num, dn, n, lambda a, _s: f(a))
    iso = cmp.replicate(den, dd, n, lambda a, _s: f(a))
    lo, hi = np.percentile(comb / iso, [2.5, 97.5])
    return float(lo), float(hi)


def coverage(experiments: int = EXPERIMENTS, seed: int = 11) -> tuple[float, float]:
    """(run-level, old two-level bootstrap) coverage of TRUE by the 95 % interval of the p50
    ratio over ``experiments`` simulated experiments."""
    rng = np.random.default_rng(seed)
    new = old = 0
    for i in range(experiments):
        num, den = _experiment(rng)
        blocks = [str(b) for b in range(BLOCKS)]
        level, n_blocks, status = cmp.run_level_stats(
            list(zip(blocks, num, strict=True)), list(zip(blocks, den, strict=True))
        )
        assert status == "ok" and n_blocks == BLOCKS
        new += level["p50"]["run_ci_low"] <= TRUE <= level["p50"]["run_ci_high"]
        lo, hi = _two_level_p50_interval(num, den, seed=i)
        old += lo <= TRUE <= hi
    return new / experiments, old / experiments


def test_run_level_intervals_cover_a_planted_ratio_and_the_old_ones_do_not() -> None:
    new, old = coverage()
    # docs/results-h200.md states both numbers (seed 11: 0.957 and 0.908). Resampling 3 runs
    # shrinks their scatter by sqrt(2/3) and has 10 distinct resamples: too narrow, though not
    # by much at 3 runs.
    assert new >= 0.93
    assert old < 0.93 and old <= new - 0.03
