"""The same traces give the same tables: summarize + compare on committed real traces, checked
against tables written by the code before a refactor.

The traces in tests/golden/traces are real CPU runs of the harness (gzip'd: HDF5 chunks of a
few rows are mostly padding). A fresh run gives different numbers, so the traces are generated
once and only the tables are recomputed here. To regenerate, from the repository root:
``PYTHONPATH=src python tests/test_golden_tables.py [--tables-only]``; change the golden tables
only for an intended change of the analysis, and say which and why in the commit.
"""

from __future__ import annotations

import gzip
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from codl.analysis import columns
from codl.analysis import compare as cmp
from codl.analysis import efficiency as eff
from codl.analysis.load import flag_comparison
from codl.datasets import generate
from codl.harness.launch import launch
from codl.spec import DatasetSpec, RunSpec
from codl.steps.analysis import compare_to, summarize_to

GOLDEN = Path(__file__).resolve().parent / "golden"
TRACES = GOLDEN / "traces"
TABLES = GOLDEN / "tables"
# compare_to's keyword for each table -> its golden file.
TABLE_FILES = {
    "runs_table": "runs.csv",
    "steps_table": "steps.csv",
    "comparison_table": "comparison.csv",
    "attribution_table": "attribution.csv",
    "decomposition_table": "decomposition.csv",
}
# One-rank combined with its three isolation twins, and a two-rank (gloo) combined with only its
# compute+comm twin, so that the rows naming a missing twin are covered too.
RUNS: dict[str, tuple[str, int]] = {
    "r1_data": ("data", 1),
    "r1_compute": ("compute", 1),
    "r1_combined": ("combined", 1),
    "r2_compute_comm": ("compute+comm", 2),
    "r2_combined": ("combined", 2),
}
# The tables pass through parquet and CSV; 1e-12 absorbs the last digit of a float's text form
# and nothing a real change of the analysis would produce.
TOLERANCE = 1e-12


def _spec(mode: str, ranks: int) -> RunSpec:
    # As small as a run gets while every summarize path still has rows: a loader worker,
    # warm-up and measured steps and, with two ranks, AllReduce.
    return RunSpec.from_dict(
        {
            "mode": mode,
            "workload": {"batch_size": 4, "image_size": 32},
            "dataset": {"samples": 32, "height": 40, "width": 48},
            "loader": {"workers": 1},
            "layout": {"ranks_per_node": ranks},
            "steps": {"warmup": 2, "measured": 4},
        }
    )


def make_traces(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "jpeg"
        generate(DatasetSpec(samples=32, height=40, width=48), data)
        for name, (mode, ranks) in RUNS.items():
            trace = Path(tmp) / f"{name}.h5"
            launch(_spec(mode, ranks), trace_path=trace, dataset_dir=data)
            packed = out / f"{name}.h5.gz"
            with trace.open("rb") as src, gzip.GzipFile(packed, "wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst)


def make_tables(traces: Path, out: Path, work: Path) -> dict[str, Path]:
    """Summarize every trace under ``traces`` and compare them, as the workflow's rules do."""
    per_run: dict[str, list[Path]] = {k: [] for k in ("summary", "steps", "attribution", "parts")}
    for packed in sorted(traces.glob("*.h5.gz")):
        trace = work / packed.name.removesuffix(".gz")
        with gzip.open(packed, "rb") as src, trace.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        paths = {k: work / f"{trace.stem}.{k}.parquet" for k in per_run}
        summarize_to(trace, **paths)
        for k, p in paths.items():
            per_run[k].append(p)
    tables = {k: out / v for k, v in TABLE_FILES.items()}
    compare_to(
        summaries=per_run["summary"],
        steps=per_run["steps"],
        attributions=per_run["attribution"],
        parts=per_run["parts"],
        **tables,
    )
    return tables


def assert_same_table(got: pd.DataFrame, want: pd.DataFrame, name: str) -> None:
    assert list(got.columns) == list(want.columns), name
    assert len(got) == len(want), name
    for col in want.columns:
        g, w = got[col], want[col]
        if pd.api.types.is_numeric_dtype(w) and pd.api.types.is_numeric_dtype(g):
            ok = np.isclose(g, w, rtol=TOLERANCE, atol=TOLERANCE, equal_nan=True)
            assert ok.all(), f"{name}.{col}: rows {np.flatnonzero(~ok)[:5]} differ"
        else:
            assert g.astype(str).tolist() == w.astype(str).tolist(), f"{name}.{col}"


def test_golden_traces_give_the_golden_tables(tmp_path: Path) -> None:
    assert sorted(p.name for p in TRACES.glob("*.h5.gz")) == sorted(f"{n}.h5.gz" for n in RUNS)
    tables = make_tables(TRACES, tmp_path / "tables", tmp_path)
    for path in tables.values():
        want = pd.read_csv(TABLES / path.name)
        got = pd.read_csv(path)
        assert_same_table(got, want, path.name)


def test_a_runs_table_without_twin_ids_gives_the_same_comparison(tmp_path: Path) -> None:
    # Runs tables written before summarize wrote the ids (results/*/tables) are paired by their
    # spec columns; on these runs that is the pairing the ids give.
    runs = pd.read_csv(TABLES / "runs.csv", dtype={"run_id": str})
    assert runs[cmp.GROUP_ID].notna().all()
    old = runs.drop(columns=[cmp.GROUP_ID, *cmp.TWIN_COLUMNS, *cmp.TWIN_GROUP_COLUMNS])
    steps = pd.read_csv(TABLES / "steps.csv", dtype={"run_id": str})
    want = pd.read_csv(TABLES / "comparison.csv")
    # The background-load flag and the groups' efficiency as compare_to adds them.
    got = eff.with_group_efficiency(flag_comparison(cmp.compare(steps, old), old), old)
    got.to_csv(tmp_path / "comparison.csv", index=False)
    assert_same_table(pd.read_csv(tmp_path / "comparison.csv"), want, "comparison.csv")


def test_the_comparison_covers_every_component_and_a_missing_twin() -> None:
    # Guards the fixture itself: a golden set that lost its comparisons would pass vacuously.
    table = pd.read_csv(TABLES / "comparison.csv")
    assert set(table["component"]) == {"data", "compute", "comm", "compute+comm"}
    assert (table["status"] == "ok").any()
    assert table["status"].astype(str).str.startswith("missing").any()


@pytest.mark.parametrize("shift", [1e-9, 1e-3])
def test_a_changed_value_is_caught(shift: float) -> None:
    want = pd.read_csv(TABLES / "steps.csv")
    got = want.copy()
    col = next(c for c in got.columns if c.endswith("_ms"))
    got.loc[0, col] = got.loc[0, col] + shift
    with pytest.raises(AssertionError):
        assert_same_table(got, want, "steps.csv")


def test_mode_vocabulary_derived_from_spec_is_the_one_compare_used() -> None:
    # compare and summarize spelled these out as strings before they were derived from
    # spec.Mode; the literals are the old tables, kept to show the derivation changed nothing
    # (data+sleep is compared on data only; combined also on its compute+comm twin).
    assert cmp.MODE_COMPONENTS == {
        "data": ("data",),
        "compute": ("compute",),
        "comm": ("comm",),
        "compute+comm": ("compute", "comm"),
        "data+compute": ("data", "compute"),
        "combined": ("data", "compute", "comm", "compute+comm"),
        "data+sleep": ("data",),
    }
    assert {"data", "compute", "comm"} == cmp.ISOLATION_MODES
    loading = {"data", "data+compute", "combined", "data+sleep"}
    assert loading == cmp.LOADING_MODES
    assert loading == columns.LOADING_MODES


if __name__ == "__main__":
    if "--tables-only" not in sys.argv[1:]:
        shutil.rmtree(TRACES, ignore_errors=True)
        make_traces(TRACES)
    with tempfile.TemporaryDirectory() as tmp:
        make_tables(TRACES, TABLES, Path(tmp))


def test_backfilled_helper_times_equal_the_summarized_ones(tmp_path: Path) -> None:
    # scripts/backfill_role_cpu.py derives the helpers' on-CPU time of tables summarized before
    # summarize had the columns from their attribution table; on the golden `none` runs (gloo's
    # comm threads are their helpers) it must give what summarize gives.
    script = GOLDEN.parent.parent / "scripts" / "backfill_role_cpu.py"
    spec = importlib.util.spec_from_file_location("backfill_role_cpu", script)
    assert spec is not None and spec.loader is not None
    backfill = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backfill)
    steps = pd.read_csv(TABLES / "steps.csv")
    helper_columns = [f"{r}_run_ms" for r in columns.HELPER_ROLES]
    tables = tmp_path / "tables"
    tables.mkdir()
    pd.read_csv(TABLES / "runs.csv").to_csv(tables / "runs.csv", index=False)
    steps.drop(columns=helper_columns).to_csv(tables / "steps.csv.gz", index=False)
    pd.read_csv(TABLES / "attribution.csv").to_csv(tables / "attribution.csv.gz", index=False)
    backfill.backfill(tmp_path)
    got = pd.read_csv(tables / "steps.csv.gz").set_index(["run_id", "rank", "step"])
    want = steps.set_index(["run_id", "rank", "step"])
    assert (want["comm_run_ms"] > 0).any()
    recorded = want["launch_run_ms"].notna()
    np.testing.assert_allclose(
        got.loc[recorded, helper_columns].to_numpy(),
        want.loc[recorded, helper_columns].to_numpy(),
        atol=1e-9,
    )
