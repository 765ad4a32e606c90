"""The invocation as a level: blocks of several invocations pooled without counting them as
independent of their invocation (codl.analysis.levels), checked against the committed nice-19
result (issue 56: three invocations, 34 blocks) and against small constructed cases.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from codl.analysis import levels as lv
from codl.cli import main
from codl.errors import CodlError
from codl.paths import ResultPaths
from codl.steps.levels import invocation_name, levels_to

NICE = Path(__file__).parents[1] / "results" / "nice-h200"
NICE_TABLES = [NICE / s / "tables" / "gil_runs.csv" for s in ("a", "b", "c")]


def _row(table: pd.DataFrame, method: lv.Method, **knobs: object) -> pd.Series:
    sel = table["method"] == method.value
    for k, v in knobs.items():
        sel &= table[k] == v
    (i,) = table.index[sel]
    row: pd.Series = table.loc[i]
    return row


def _pct(v: float) -> float:
    return round(100 * v, 1)


@pytest.fixture(scope="module")
def nice() -> pd.DataFrame:
    return levels_to(NICE_TABLES, Path("/dev/null"))


def test_nice19_isolated_main_reads_wider_with_the_invocation_as_the_unit(
    nice: pd.DataFrame,
) -> None:
    knobs = {"policy": "isolated-main", "handoff": "ring", "worker_nice": 19}
    blocks = _row(nice, lv.Method.BLOCKS, **knobs)
    # Issue 56: +1.6 % [-1.2, +4.5] over 34 blocks pooled as if independent ...
    assert (_pct(blocks.value), _pct(blocks.low), _pct(blocks.high)) == (1.6, -1.2, 4.5)
    assert (blocks.n_blocks, blocks.n_invocations) == (34, 3)
    # ... the pooled table says the same (the blocks method is its interval) ...
    pooled = pd.read_csv(NICE / "tables" / "pooled_inflation.csv")
    same = pooled[(pooled["policy"] == "isolated-main") & (pooled["worker_nice"] == 19)]
    assert same["inflation"].iloc[0] == pytest.approx(blocks.value)
    # ... the invocations' variances differ (Levene p = 0.035) ...
    assert round(blocks.levene_p, 3) == 0.035
    # ... and with the invocation as the unit: [-6.7, +13.1], n = 3. The centre,
    # +2.8 %, is the arithmetic mean of the invocations' geometric means; the centre of that
    # interval (Student t on the invocations' mean logs) is their geometric mean, +2.7 %.
    means = _row(nice, lv.Method.INVOCATION_MEANS, **knobs)
    assert (_pct(means.value), _pct(means.low), _pct(means.high)) == (2.7, -6.7, 13.1)
    ratios = lv.invocation_ratios({invocation_name(p): pd.read_csv(p) for p in NICE_TABLES})
    setting = ratios[(ratios["policy"] == "isolated-main") & (ratios["worker_nice"] == 19)]
    geomeans = np.exp(np.log(setting["ratio"]).groupby(setting["invocation"]).mean())
    assert _pct(geomeans.mean() - 1) == 2.8
    assert means.low < blocks.low and means.high > blocks.high
    re = _row(nice, lv.Method.RANDOM_EFFECTS, **knobs)
    assert re.tau2 > 0 and 0 < re.i2 < 1 and 0 < re.cochran_q_p < 1
    assert re.low < re.value < re.high


def test_a_setting_of_one_invocation_says_so(nice: pd.DataFrame) -> None:
    one = nice[(nice["policy"] == "none") & (nice["handoff"] == "torch")]
    assert set(one["note"]) == {lv.SINGLE_INVOCATION}
    assert set(one["n_invocations"]) == {1}
    means = _row(one, lv.Method.INVOCATION_MEANS, worker_nice=0)
    assert math.isnan(means.low) and math.isnan(means.high)
    assert math.isnan(_row(one, lv.Method.RANDOM_EFFECTS, worker_nice=0).value)
    # The blocks' interval is all one invocation gives, and it is still given.
    assert math.isfinite(_row(one, lv.Method.BLOCKS, worker_nice=0).low)


def test_the_committed_table_is_what_the_code_writes(nice: pd.DataFrame) -> None:
    committed = ResultPaths(root=NICE.parents[1], set_name="nice-h200").pooled_levels_table
    # Through CSV both, so that an empty note reads as the committed file's does.
    written = pd.read_csv(io.StringIO(nice.to_csv(index=False)))
    pd.testing.assert_frame_equal(pd.read_csv(committed), written)


def _ratios(groups: dict[str, list[float]], node: dict[str, str] | None = None) -> pd.DataFrame:
    rows = [
        {"invocation": inv, "ratio": float(np.exp(x)), "twin_id": f"{inv}{i}"}
        for inv, xs in groups.items()
        for i, x in enumerate(xs)
    ]
    out = pd.DataFrame(rows)
    if node is not None:
        out["node"] = out["invocation"].map(node)
    return out


def test_equal_invocations_pool_to_the_mean_of_their_means() -> None:
    spread = [-0.02, 0.0, 0.02]
    groups = {k: [m + s for s in spread] for k, m in (("a", 0.1), ("b", 0.1), ("c", 0.1))}
    table = lv.level_intervals(_ratios(groups))
    re = _row(table, lv.Method.RANDOM_EFFECTS)
    assert re.tau2 == 0 and re.i2 == 0 and re.cochran_q == pytest.approx(0)
    assert re.value == pytest.approx(math.expm1(0.1))
    assert re.levene_p == pytest.approx(1)
    # Identical invocations: the invocation means have no spread, so no width.
    means = _row(table, lv.Method.INVOCATION_MEANS)
    assert means.low == pytest.approx(means.high)


def test_invocations_far_apart_are_heterogeneous() -> None:
    spread = [-0.01, 0.0, 0.01]
    groups = {k: [m + s for s in spread] for k, m in (("a", 0.0), ("b", 0.2), ("c", 0.4))}
    table = lv.level_intervals(_ratios(groups))
    re = _row(table, lv.Method.RANDOM_EFFECTS)
    assert re.i2 > 0.99 and re.cochran_q_p < 1e-6
    # DerSimonian-Laird's tau^2 by hand: Q, the weights' C and k - 1.
    y, v = np.array([0.0, 0.2, 0.4]), np.full(3, np.var(spread, ddof=1) / 3)
    w = 1 / v
    q = float((w * (y - (w * y).sum() / w.sum()) ** 2).sum())
    c = float(w.sum() - (w**2).sum() / w.sum())
    assert re.tau2 == pytest.approx((q - 2) / c)
    blocks = _row(table, lv.Method.BLOCKS)
    means = _row(table, lv.Method.INVOCATION_MEANS)
    assert means.high - means.low > blocks.high - blocks.low


def test_the_same_invocation_name_on_two_nodes_is_two_invocations() -> None:
    groups = {"a": [0.0, 0.1], "b": [0.05, 0.15]}
    ratios = pd.concat(
        [
            _ratios(groups, node={"a": "n1", "b": "n1"}),
            _ratios(groups, node={"a": "n2", "b": "n2"}),
        ],
        ignore_index=True,
    )
    row = _row(lv.level_intervals(ratios), lv.Method.INVOCATION_MEANS)
    assert (row.n_invocations, row.n_nodes, row.n_blocks) == (4, 2, 8)


def test_one_block_per_invocation_has_no_random_effects_but_invocation_means() -> None:
    table = lv.level_intervals(_ratios({"a": [0.0], "b": [0.1], "c": [0.2]}))
    assert math.isnan(_row(table, lv.Method.RANDOM_EFFECTS).value)
    assert math.isnan(_row(table, lv.Method.BLOCKS).levene_p)
    assert math.isfinite(_row(table, lv.Method.INVOCATION_MEANS).low)


def test_ratios_without_an_invocation_are_refused() -> None:
    with pytest.raises(ValueError, match=r"no column \['invocation'\]"):
        lv.level_intervals(pd.DataFrame({"ratio": [1.0]}))


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("results/nice-h200/a/tables/gil_runs.csv", "a"),
        ("results/my set ü/tables/pooled_runs.csv", "my set ü"),
        ("elsewhere/a/gil_runs.csv", "a"),
    ],
)
def test_an_invocation_is_named_by_its_directory(path: str, name: str) -> None:
    assert invocation_name(Path(path)) == name


def test_codl_levels_writes_the_table_and_refuses_a_second_table_of_one_invocation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out dir" / "pooled_levels.csv"
    assert main(["levels", *map(str, NICE_TABLES), "--out", str(out)]) == 0
    assert "18 rows" in capsys.readouterr().out
    assert len(pd.read_csv(out)) == 18
    with pytest.raises(CodlError, match="a second table of invocation 'a'"):
        levels_to([NICE_TABLES[0], NICE_TABLES[0]], out)
    with pytest.raises(CodlError, match="no such pooled runs table"):
        levels_to([tmp_path / "missing.csv"], out)


def test_a_runs_own_invocation_token_splits_its_results_directory() -> None:
    runs = pd.read_csv(NICE_TABLES[2])
    # Two workflow invocations wrote this directory: the first ten repeats, then the rest.
    runs["invocation"] = np.where(runs["repeat"] < 10, "x1", "x2")
    ratios = lv.invocation_ratios({"c": runs})
    assert set(ratios["invocation"]) == {"c/x1", "c/x2"}
    untagged = lv.invocation_ratios({"c": pd.read_csv(NICE_TABLES[2])})
    assert set(untagged["invocation"]) == {"c"}
