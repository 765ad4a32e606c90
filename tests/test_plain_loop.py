"""examples/plain-loop: the plain training script runs on a CPU with either loader, and the
benchmark that compares them writes its table and CSV."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--model", "tiny", "--device", "cpu", "--batch-size", "4", "--image-size", "32"]
TINY += ["--samples", "8", "--warmup", "1"]


def _module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_script_trains_with_either_loader_on_the_same_batches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In this process: an interpreter start per run would cost more than the runs.
    train = _module(ROOT / "examples" / "plain-loop" / "train.py", "plain_loop_train")
    results = {}
    for loader in ("torch", "codl"):
        assert (
            train.main([*TINY, "--loader", loader, "--workers", "2", "--steps", "3", "--json"]) == 0
        )
        results[loader] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for r in results.values():
        assert r["samples_per_s"] > 0 and r["step_compute_ms"] > 0 and r["steps"] == 3
    assert results["torch"]["batches_digest"] == results["codl"]["batches_digest"]


def test_a_bad_argument_is_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    train = _module(ROOT / "examples" / "plain-loop" / "train.py", "plain_loop_train")
    with pytest.raises(SystemExit):
        train.main([*TINY, "--batch-size", "0"])
    assert "--batch-size must be >= 1, got 0" in capsys.readouterr().err


def test_the_benchmark_writes_its_table_and_csv(tmp_path: Path) -> None:
    bench = _module(ROOT / "benchmarks" / "plain_loop.py", "plain_loop_bench")
    argv = [*TINY, "--workers", "1", "--blocks", "1", "--steps", "2", "--no-compute-runs"]
    assert bench.main([*argv, "--out", str(tmp_path)]) == 0
    with open(tmp_path / "plain_loop.csv") as f:
        rows = list(csv.DictReader(f))
    # One process per run, ABBA: block 0 starts with torch.
    assert [(r["loader"], r["workers"]) for r in rows] == [("torch", "1"), ("codl", "1")]
    assert all(float(r["samples_per_s"]) > 0 for r in rows)
    assert rows[0]["batches_digest"] == rows[1]["batches_digest"]
    table = (tmp_path / "plain_loop.md").read_text()
    assert "Command: `python benchmarks/plain_loop.py --model tiny" in table
    assert "| 1 | codl |" in table and "no interval" in table


def test_the_schedule_alternates_and_the_interval_is_a_t_interval() -> None:
    bench = _module(ROOT / "benchmarks" / "plain_loop.py", "plain_loop_bench")
    runs = bench.schedule(2, [12, 24])
    assert runs == [
        (0, "none", 0),
        (0, "torch", 12),
        (0, "codl", 12),
        (0, "codl", 24),
        (0, "torch", 24),
        (1, "none", 0),
        (1, "codl", 12),
        (1, "torch", 12),
        (1, "torch", 24),
        (1, "codl", 24),
    ]
    centre, lo, hi = bench.geo_interval([100.0, 110.0, 121.0])
    assert centre == pytest.approx(110.0)
    # log-spacing 0.0953, sd 0.0953, t(2) = 4.303: half-width 0.2367 on the log scale.
    assert lo == pytest.approx(110.0 / 1.2671, rel=1e-3) and hi == pytest.approx(
        110.0 * 1.2671, rel=1e-3
    )
