"""``codl check``: the advisor's out-of-sample checks, on the committed result sets they made.

Where a committed table's inputs are committed, the subcommand makes it again byte for byte:
a prediction scored against its runs, a held-out budget, the splits of a pool, a share plan,
the calibration's leave-one-out and blind tables. The predictions committed before their runs
are the model of their day and stay as they ran; ``predict`` is checked on their settings.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from codl import cli
from codl.advisor.verify import CHECK_KEY
from codl.paths import ResultPaths

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
CHECK = RESULTS / "fit-h200-check"
LIGHT = RESULTS / "fit-h200-light"
HEAVY = RESULTS / "fit-h200-heavy"


def check(*args: object) -> int:
    return cli.main(["check", *map(str, args)])


def same(got: Path, committed: Path) -> None:
    assert filecmp.cmp(got, committed, shallow=False), (
        f"{got} differs from {committed}:\n{got.read_text()[:2000]}"
    )


@pytest.mark.parametrize("where", [CHECK, CHECK / "alloc-a"])
def test_score_makes_the_committed_comparison(where: Path, tmp_path: Path) -> None:
    out = tmp_path / "predicted vs measured.csv"
    predicted = where / "tables" / "predicted.csv"
    assert check("score", predicted, where / "config.yaml", where, "--out", out) == 0
    same(out, where / "tables" / "predicted_vs_measured.csv")


def test_predict_predicts_every_setting_of_the_check_config(tmp_path: Path) -> None:
    out = tmp_path / "predicted.csv"
    assert check("predict", CHECK / "config.yaml", LIGHT, HEAVY, "--out", out, "--boot", 0) == 0
    got, committed = pd.read_csv(out), pd.read_csv(CHECK / "tables" / "predicted.csv")
    assert list(got.columns) == list(committed.columns)
    key = list(CHECK_KEY)
    assert got[key].equals(committed[key])
    # Without replicates the model's interval is the point.
    assert (got["lo"] == got["predicted"]).all() and (got["hi"] == got["predicted"]).all()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "committed"),
    [
        (("holdout", LIGHT, "--cores", 8), LIGHT / "tables" / "held_out_8_cores.csv"),
        (("splits", LIGHT, HEAVY, "--cores", 32), CHECK / "tables" / "advised_splits.csv"),
        (
            ("share", REPO / "config" / "share-h200x2-heavy.yaml"),
            RESULTS / "share-h200x2-heavy" / "tables" / "predicted.csv",
        ),
        (
            ("calibration", LIGHT, CHECK / "alloc-a"),
            CHECK / "alloc-a" / "tables" / "calibrated_loo.csv",
        ),
    ],
    ids=["holdout", "splits", "share", "calibration"],
)
def test_committed_check_tables_regenerate(
    args: tuple[object, ...], committed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The share config names its fits relative to the checkout.
    monkeypatch.chdir(REPO)
    out = tmp_path / committed.name
    assert check(*args, "--out", out) == 0
    same(out, committed)


def blind_sets(tmp_path: Path) -> tuple[Path, Path]:
    """The committed blind check (results/fit-h200-check/blind/, measured on a GPU node
    before the workflow ran it) laid out as the workflow writes it: the calibrated set (the
    probe's tables, the plan in advice/ with its files' times) and the verification's set."""
    blind = CHECK / "blind"
    std = ResultPaths()
    cal, ver = tmp_path / "calibrate", tmp_path / "calibrate-verify"
    advice = cal / std.advice.relative_to(std.set_dir)
    advice.mkdir(parents=True)
    with tarfile.open(blind / "plan.tar") as tar:
        tar.extractall(advice, filter="data")  # keeps each member's modification time
    (advice / "uncalibrated.json").rename(cal / std.uncalibrated_record.relative_to(std.set_dir))
    for d, prefix in ((cal, "probe"), (ver, "verify")):
        runs, steps = ResultPaths.merged_tables_of(d)
        runs.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(blind / "tables" / f"{prefix}_runs.csv", runs)
        shutil.copy(blind / "tables" / f"{prefix}_steps.csv.gz", steps)
    return cal, ver


def test_blind_makes_the_committed_blind_error_table(tmp_path: Path) -> None:
    cal, ver = blind_sets(tmp_path)
    out = tmp_path / "blind_error.csv"
    assert check("blind", cal, ver, "--out", out) == 0
    same(out, CHECK / "blind" / "tables" / "blind_error.csv")
    summary = "blind_error_summary.csv"
    same(tmp_path / summary, CHECK / "blind" / "tables" / summary)


def test_blind_refuses_a_probe_run_among_the_verification_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cal, ver = blind_sets(tmp_path)
    runs_csv = ResultPaths.merged_tables_of(ver)[0]
    probe = pd.read_csv(ResultPaths.merged_tables_of(cal)[0])
    pd.concat([pd.read_csv(runs_csv), probe.head(1)]).to_csv(runs_csv, index=False)
    out = tmp_path / "blind.csv"
    assert check("blind", cal, ver, "--out", out) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "are probe runs: not a blind check" in err
    assert str(runs_csv) in err and not out.exists()


def test_runlevel_gives_the_verifications_headlines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runlevel.csv"
    verify = RESULTS / "loop-h200" / "verify"
    assert check("runlevel", verify, "--advice", "none/5", "--out", out) == 0
    t = pd.read_csv(out).set_index("setting")
    assert t["advised"].sum() == 1 and bool(t.loc["none/5", "advised"])
    assert t["throughput"].is_monotonic_decreasing
    # docs/advisor.md, "The verification": the advice reaches 0.90 [0.75, 1.08] of none/16,
    # paired over its 3 blocks.
    row = t.loc["none/16"]
    assert (round(row["advice_ratio"], 2), round(row["advice_ratio_lo"], 2)) == (0.90, 0.75)
    assert round(row["advice_ratio_hi"], 2) == 1.08
    assert (row["pairing"], row["ratio_n"], row["n_blocks"]) == ("paired", 3, 3)
    assert "none/16" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (("score", "missing.csv", CHECK / "config.yaml", CHECK), "missing.csv"),
        (("calibration", LIGHT, "nowhere"), "nowhere"),
        (("blind", "nowhere", CHECK), "nowhere"),
        (("runlevel", RESULTS / "loop-h200" / "verify", "--advice", "none/99"), "none/99"),
        (("predict", "no such.yaml", LIGHT), "no such.yaml"),
    ],
    ids=["predictions", "results", "calibrated-set", "advice", "config"],
)
def test_bad_input_is_one_line_naming_it(
    args: tuple[object, ...], names: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.csv"
    assert check(*args, "--out", out) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"codl check {args[0]}: error:") and err.count("\n") == 0
    assert names in err and not out.exists()


def test_help_lists_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        check("--help")
    assert done.value.code == 0
    text = capsys.readouterr().out
    for name in ("predict", "score", "holdout", "splits", "share", "uncalibrated", "blind"):
        assert name in text
    assert "calibration" in text and "runlevel" in text


def numeric_options() -> list[tuple[str, str]]:
    """(check, option) for every numeric option of every check."""
    from codl.cli.check import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [
        (name, action.option_strings[-1])
        for name, parser in sub.choices.items()
        for action in parser._actions
        if action.option_strings and getattr(action.type, "__name__", "") in NUMERIC
    ]


NUMERIC = ("number", "integer")


@pytest.mark.parametrize(("name", "option"), numeric_options())
def test_every_numeric_option_refuses_nan_negative_and_huge(
    name: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for value in ("nan", "inf", "-1", "1e300", "9" * 40, "text"):
        with pytest.raises(SystemExit) as exc:
            check(name, f"{option}={value}")
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1, (option, value, err)
        assert err.startswith(f"codl check {name}: error: ") and option in err, err
