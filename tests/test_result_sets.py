"""Each config writes its own result set, results/<name>/, and `make clean` never touches a
committed one."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from codl.errors import ConfigError
from codl.paths import ResultPaths, set_name_of

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("cfg", "files", "name"),
    [
        ({}, ["config/smoke.yaml"], "smoke"),
        ({}, ["a.yaml", "b/paper.yml"], "paper"),  # the last config file names it
        ({"name": "mine"}, ["config/smoke.yaml"], "mine"),
        ({"name": None}, ["config/smoke.yaml"], "smoke"),
        # A config the advisor wrote inside a result set: that set's verification runs.
        ({}, ["results/loop-cpu/advice/verify.yaml"], "loop-cpu-verify"),
        ({}, ["results/loop-h200/advice/verify.yaml"], "loop-h200-verify"),
        ({}, ["results/x.yaml"], "x"),
    ],
)
def test_the_set_is_named_by_the_key_or_the_file(
    cfg: dict[str, object], files: list[str], name: str
) -> None:
    assert set_name_of(cfg, files) == name


@pytest.mark.parametrize(
    ("cfg", "files", "message"),
    [
        ({"name": "runs"}, [], "names the runs' directory"),
        ({}, ["config/runs.yaml"], "names the runs' directory"),
        ({}, ["my config.yaml"], "'my config' cannot name a result set"),
        ({}, [], "no config file and no `name` key"),
        ({"name": "../up"}, [], "cannot name a result set"),
    ],
)
def test_a_name_that_cannot_be_a_set_is_refused(
    cfg: dict[str, object], files: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        set_name_of(cfg, files)


def test_merged_outputs_go_to_the_set_and_runs_stay_shared() -> None:
    a, b = ResultPaths(set_name="a"), ResultPaths(set_name="b")
    assert a.runs_table == Path("results/a/tables/runs.csv")
    assert a.figure("x") == Path("results/a/figures/x.png")
    assert a.report == Path("results/a/report.html")
    assert a.advice_text == Path("results/a/advice/advice.txt")
    assert a.trace("abc") == b.trace("abc") == Path("results/runs/abc/trace.h5")
    assert {a.tables, a.figures, a.advice, a.share}.isdisjoint({b.tables, b.figures, b.share})


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_clean_keeps_committed_result_sets(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copy2(REPO / "Makefile", root / "Makefile")
    shutil.copy2(REPO / ".gitignore", root / ".gitignore")
    committed = root / "results" / "h200" / "tables" / "runs.csv"
    committed.parent.mkdir(parents=True)
    committed.write_text("run_id\nabc\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "sets")
    made = [
        root / "results" / "smoke" / "tables" / "runs.csv",  # an ignored set
        root / "results" / "runs" / "abc" / "trace.h5",
        root / "results" / "h200" / "figures" / "new.png",  # made inside a committed set
        root / "resources" / "datasets" / "d" / "MANIFEST.json",
        root / "logs" / "run" / "abc.log",
    ]
    for path in made:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    committed.write_text("run_id\nedited\n")  # a regenerated committed table stays as it is
    proc = subprocess.run(["make", "clean"], cwd=root, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert committed.read_text() == "run_id\nedited\n"
    assert not [p for p in made if p.exists()]


def test_make_clean_outside_a_checkout_refuses(tmp_path: Path) -> None:
    shutil.copy2(REPO / "Makefile", tmp_path / "Makefile")
    kept = tmp_path / "results" / "h200" / "tables" / "runs.csv"
    kept.parent.mkdir(parents=True)
    kept.write_text("x")
    proc = subprocess.run(
        ["make", "clean"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)},
    )
    assert proc.returncode != 0 and "not a git checkout" in proc.stderr
    assert kept.is_file()
