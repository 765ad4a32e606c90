"""Run-level intervals: honest at 2-10 runs when runs scatter more than steps do."""

from __future__ import annotations

import math

import numpy as np
import pytest

from codl.analysis.runlevel import log_ratio_interval


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
