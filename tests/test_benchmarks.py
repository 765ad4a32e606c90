"""The benchmarks write codl.measure's CSV and table, run as a user types them, tiny.

Only the ones that take a second here: the others time end-to-end runs (docs/performance.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from codl.measure import PAIRED, read_csv

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"


def run(script: str, *args: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_proc_stat_cost_records_rounds_and_their_pairs(tmp_path: Path) -> None:
    out = tmp_path / "proc stat.csv"
    text = run(
        "proc_stat_cost.py", "--rounds", "3", "--calls", "20", "--csv", str(out), cwd=tmp_path
    )
    got = {(m.name, m.setting.get("reader")): m for m in read_csv(out)}
    assert set(got) == {("per call", "codl"), ("per call", "psutil"), ("psutil / codl", None)}
    assert got["per call", "codl"].rounds == 3
    assert got["per call", "codl"].n == (20, 20, 20)
    pair = got["psutil / codl", None]
    assert pair.statistic == PAIRED
    assert pair.values == tuple(
        p / c
        for p, c in zip(
            got["per call", "psutil"].values, got["per call", "codl"].values, strict=True
        )
    )
    assert "| per call |" in text
    assert "reader=codl" in text
    assert "psutil / codl" in text
    assert "machine: " in text


def test_launch_api_cost_pools_a_committed_csv_of_the_old_columns(tmp_path: Path) -> None:
    old = BENCH / "results" / "launch_api_cost_2ranks.csv"
    out = tmp_path / "pooled.csv"
    run("launch_api_cost.py", "--pool", str(old), "--csv", str(out), cwd=tmp_path)
    first = read_csv(out)
    steps = {m.setting["variant"]: m for m in first if m.name == "step"}
    assert "plain" in steps
    ratios = [m for m in first if m.name == "step / plain"]
    assert ratios and all(m.statistic == PAIRED for m in ratios)
    # Its own CSV pools again, beside the old one: rounds add up, each file's pairs kept.
    again = tmp_path / "again.csv"
    run("launch_api_cost.py", "--pool", str(out), str(old), "--csv", str(again), cwd=tmp_path)
    twice = {(m.name, m.setting["variant"]): m for m in read_csv(again)}
    for m in ratios:
        assert twice[m.name, m.setting["variant"]].values == m.values * 2
