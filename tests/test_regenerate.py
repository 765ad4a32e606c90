"""`codl regenerate` / `make results`: every committed result set's derived tables rebuilt from
what the set commits, through the functions the workflow's rules call, equal to what is
committed; a changed cell is named; `--write` puts the rebuilt files back as one unit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from codl.steps.regenerate import Status, exit_code, regenerate

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
#: A small set with a compare step and a pooled step (its gil_runs.csv) to perturb.
SMALL = "transformer-h200"


def _copy_set(tmp_path: Path, name: str = SMALL) -> Path:
    root = tmp_path / "results"
    shutil.copytree(RESULTS / name, root / name)
    return root


@pytest.mark.slow
def test_every_committed_set_regenerates_to_what_is_committed() -> None:
    verdicts = regenerate(RESULTS)
    differ = [v.line() for v in verdicts if v.status is Status.DIFFERS]
    assert not differ, "\n".join(differ)
    assert exit_code(verdicts) == 0
    # The sets with merged tables are rebuilt, not waved through as "cannot".
    ok = {v.name for v in verdicts if v.status is Status.OK}
    assert {"h200", "h200x2", "handoff-h200/a", "nice-h200", "blocks-h200"} <= ok
    cannot = [v for v in verdicts if v.status is Status.CANNOT]
    assert all(v.details for v in cannot), "a set that cannot be rebuilt says why"


@pytest.mark.slow
def test_a_changed_cell_is_named_and_write_restores_it(tmp_path: Path) -> None:
    root = _copy_set(tmp_path)
    table = root / SMALL / "a" / "tables" / "comparison.csv"
    df = pd.read_csv(table)
    col = next(c for c in df.select_dtypes("float").columns if df[c].abs().sum() > 0)
    df.loc[df[col].abs().idxmax(), col] *= 1.01
    df.to_csv(table, index=False)

    (v_parent, v_a) = regenerate(root)
    assert v_a.name == f"{SMALL}/a" and v_a.status is Status.DIFFERS
    assert f"comparison.csv {col}" in v_a.details
    assert v_parent.status is Status.OK
    assert exit_code([v_parent, v_a]) == 1

    verdicts = regenerate(root, write=True)
    assert [v.status for v in verdicts] == [Status.OK, Status.OK]
    committed = pd.read_csv(RESULTS / SMALL / "a" / "tables" / "comparison.csv")
    pd.testing.assert_frame_equal(pd.read_csv(table), committed, check_exact=False, rtol=1e-9)


def test_a_set_without_tables_says_it_cannot_be_rebuilt(tmp_path: Path) -> None:
    root = tmp_path / "results"
    (root / "gone" / "tables").mkdir(parents=True)
    (root / "gone" / "README.md").write_text("# gone\n\nIts runs were lost with the node.\n")
    (root / "runs").mkdir()  # the runs' own directory is never a set
    (v,) = regenerate(root)
    assert v.status is Status.CANNOT and v.details == ("Its runs were lost with the node.",)
    assert exit_code([v]) == 0


def test_the_command_names_a_missing_set_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "codl.cli",
            "regenerate",
            "--results",
            str(tmp_path / "results"),
            "nope",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "nope: no such result set" in lines[0], proc.stderr


def test_a_decomposition_measured_from_traces_is_kept_not_rebuilt(tmp_path: Path) -> None:
    # results/roofline commits the decomposition its traces gave (the launch roles' host time
    # of the compute span); the steps table holds only the whole step's, so a rebuild from it
    # would lose a measurement: --write leaves both tables as they are, and says why.
    root = _copy_set(tmp_path, "roofline")
    tables = root / "roofline" / "tables"
    before = {p.name: p.read_bytes() for p in tables.glob("*")}
    (verdict,) = regenerate(root, write=True)
    assert verdict.status is Status.OK
    assert any("decomposition.csv.gz: not rebuilt" in s for s in verdict.skipped)
    assert "tables/comparison.csv" not in verdict.checked
    assert {p.name: p.read_bytes() for p in tables.glob("*")} == before
