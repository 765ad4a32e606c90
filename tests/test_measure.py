"""codl.measure: the one measurement type of the benchmarks, its CSV and its tables."""

from __future__ import annotations

import ast
import csv
import math
import re
import statistics
from pathlib import Path

import pytest

from codl.measure import (
    COLUMNS,
    PAIRED,
    Context,
    Machine,
    Measurement,
    Recorder,
    bootstrap_median,
    paired,
    read_csv,
    table,
    write_csv,
)

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
CTX = Context(
    machine=Machine(hostname="node-1", cpu="Test CPU @ 2.0GHz", cores=8, gpu="Test GPU"),
    commit="0123456789abcdef0123456789abcdef01234567",
    dirty=True,
    date="2026-12-06T07:00:00+00:00",
    command="benchmarks/x.py --repeat 3",
)


def m(
    values: tuple[float, ...],
    *,
    name: str = "wall",
    unit: str = "s",
    load: tuple[float, float] = (0.5, 0.5),
    **settings: str,
) -> Measurement:
    return Measurement(
        name=name,
        unit=unit,
        values=values,
        n=tuple(10 for _ in values),
        context=CTX,
        load_start=load[0],
        load_end=load[1],
        statistic="median step",
        settings=tuple(settings.items()),
    )


def test_statistics_of_known_values() -> None:
    x = m((3.0, 1.0, 2.0, 10.0))
    assert x.rounds == 4
    assert x.median == 2.5
    assert (x.min, x.max) == (1.0, 10.0)
    assert x.mean == 4.0
    assert x.stdev == pytest.approx(statistics.stdev([3, 1, 2, 10]))
    assert x.describe() == "median 2.50 s (min 1.00, max 10.0, 4 rounds of n=10)"
    one = m((7.0,))
    assert (one.median, one.stdev, one.spread) == (7.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("values", "n", "error"),
    [((), (), "no rounds"), ((1.0, 2.0), (1,), "2 rounds but 1 n's")],
)
def test_a_measurement_needs_rounds_and_one_n_each(
    values: tuple[float, ...], n: tuple[int, ...], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        Measurement(name="x", unit="s", values=values, n=n, context=CTX, load_start=0, load_end=0)


def test_paired_ratio_is_taken_round_by_round() -> None:
    a = m((3.0, 4.0, 6.0), variant="traced", level="sched")
    b = m((1.0, 2.0, 2.0), variant="untraced", level="sched")
    r = paired(a, b, "traced / untraced")
    assert r.values == (3.0, 2.0, 3.0)
    assert r.statistic == PAIRED
    assert r.unit == "x"
    assert r.setting == {"level": "sched"}  # the settings both sides share
    assert r.describe() == "paired median 3.00x (min 2.00, max 3.00, 3 pairs)"
    # The ratio of medians is not the paired median: rounds that drift cancel only in pairs.
    assert a.median / b.median != r.median


def test_paired_needs_the_same_rounds_and_unit() -> None:
    with pytest.raises(ValueError, match="3 and 2 rounds"):
        paired(m((1.0, 2.0, 3.0)), m((1.0, 2.0)))
    with pytest.raises(ValueError, match="units"):
        paired(m((1.0,)), m((1.0,), unit="ms"))


@pytest.mark.parametrize(
    "name", ["wall", "wall, memory round", 'a "quoted", name', "débit/s ✓", "tab\there"]
)
def test_csv_round_trip(tmp_path: Path, name: str) -> None:
    written = [
        m((0.1, 0.2, 1 / 3), name=name, what="codl summarize", events="1e7"),
        m((1e-9, 12345678.9), name="rate", unit="1/s", what="plain h5py read"),
        paired(m((1.0, 3.0)), m((2.0, 2.0))),
    ]
    path = tmp_path / "dir with space" / "out.csv"
    write_csv(path, written)
    assert read_csv(path) == written  # floats exactly, settings in order, context whole
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == COLUMNS
    assert float(rows[0]["median"]) == pytest.approx(0.2)
    assert rows[0]["commit"] == CTX.commit
    assert rows[0]["dirty"] == "1"
    assert not list(tmp_path.rglob("*.tmp"))


def test_read_csv_names_a_file_of_another_schema(tmp_path: Path) -> None:
    old = tmp_path / "old.csv"
    old.write_text("events,what,seconds\n10,codl summarize,1.5\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"old\.csv: not a codl\.measure CSV"):
        read_csv(old)


def test_table_spreads_a_setting_into_columns_with_ratios() -> None:
    ms = [
        m((1.0, 1.2, 1.1), what="plain", events="1e7"),
        m((2.0, 2.4, 2.2), what="codl", events="1e7"),
        m((3.0,), name="peak rss", unit="MiB", what="codl", events="1e7"),
        paired(m((2.0, 2.4, 2.2)), m((1.0, 1.2, 1.1)), "codl / plain"),
    ]
    assert table(ms, column="what", baseline="plain", title="## cost") == (
        "## cost\n"
        "\n"
        "| measurement | events | unit | what=plain | what=codl | codl / plain |\n"
        "|---|---|---|---|---|---|\n"
        "| wall | 1e7 | s | 1.10 (1.00-1.20) | 2.20 (2.00-2.40) | 2.00x |\n"
        "| peak rss | 1e7 | MiB |  | 3.00 |  |\n"
        "\n"
        "| measurement | unit | median (min-max) |\n"
        "|---|---|---|\n"
        "| codl / plain | x | 2.00 (2.00-2.00) |\n"
        "\n"
        "cells: median (min-max) over rounds; each round: median step of n=10, 3 rounds; "
        "median step of n=10, 1 rounds; paired ratio, 3 pairs\n"
        "machine: node-1 (Test CPU @ 2.0GHz, 8 cores, Test GPU); commit 0123456789ab+dirty; "
        "2026-12-06T07:00:00+00:00\n"
        "load average: 0.50-0.50 at start, 0.50-0.50 at end\n"
    )


def test_table_says_when_a_measurement_cannot_be_trusted() -> None:
    steady = m((1.0, 1.01), what="a")
    spread = m((1.0, 2.0), what="b")
    busy = m((1.0, 1.0), what="c", load=(0.1, 9.0))
    assert (steady.unstable, spread.unstable, busy.busy) == (False, True, True)
    text = table([steady, spread, busy], column="what")
    assert "WARNING rounds spread" in text
    assert "wall what=b (47%)" in text
    assert "WARNING load average up to 9.0 on 8 cores during 1 of 3 measurements" in text


def test_table_rejects_an_unknown_baseline() -> None:
    with pytest.raises(ValueError, match="baseline 'nope' is not a value of 'what'"):
        table([m((1.0,), what="a")], column="what", baseline="nope")


def test_recorder_fills_machine_commit_and_load(tmp_path: Path) -> None:
    rec = Recorder()
    ctx = rec.context
    assert ctx.machine.hostname
    assert ctx.machine.cpu
    assert ctx.machine.cores >= 1
    assert re.fullmatch(r"[0-9a-f]{40}", ctx.commit)  # the tests run in a git checkout
    assert ctx.date.endswith("+00:00")
    x = rec.add("step", [1.0, 2.0], unit="ms", n=[5, 6], statistic="median step", mode="data")
    assert x.n == (5, 6)
    assert x.setting == {"mode": "data"}
    assert not math.isnan(x.load_start) and not math.isnan(x.load_end)
    # Recording the same thing again replaces it (a CSV rewritten after every round), keeping
    # the load at its start.
    y = rec.add("step", [1.0, 2.0, 3.0], unit="ms", statistic="median step", mode="data")
    assert rec.measurements == [y]
    assert y.load_start == x.load_start
    assert rec.get("step", mode="data") is y
    rec.write(tmp_path / "r.csv")
    assert read_csv(tmp_path / "r.csv") == [y]


def test_bootstrap_median_is_seeded_and_brackets_the_median() -> None:
    values = [1.0, 1.1, 0.9, 1.3, 1.05]
    lo, hi = bootstrap_median(values)
    assert lo <= statistics.median(values) <= hi
    assert bootstrap_median(values) == (lo, hi)


# A benchmark that computes a median (statistics.median, np.median, a DataFrame's .median())
# reports one: it must record through codl.measure, so that its table says n, rounds, range,
# machine, load and commit like every other's.
MEDIAN_CALL = re.compile(r"\bmedian\s*\(|\.agg\([^)]*\bmedian\b")


def _imports_measure(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "codl.measure":
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "codl"
            and any(a.name == "measure" for a in node.names)
        ):
            return True
        if isinstance(node, ast.Import) and any(a.name == "codl.measure" for a in node.names):
            return True
    return False


def _computes_a_median(path: Path) -> bool:
    code = [
        line.split("#", 1)[0]
        for line in path.read_text(encoding="utf-8").splitlines()
        if not line.lstrip().startswith("#")
    ]
    return bool(MEDIAN_CALL.search("\n".join(code)))


def test_every_benchmark_that_reports_a_median_records_through_codl_measure() -> None:
    scripts = sorted(BENCHMARKS.glob("*.py"))
    assert scripts, "no benchmarks found"
    medians = [p for p in scripts if _computes_a_median(p)]
    assert len(medians) >= 10  # the check sees what it should: a broken regex would pass all
    missing = [p.name for p in medians if not _imports_measure(p)]
    assert not missing, f"benchmarks computing medians without codl.measure: {missing}"
