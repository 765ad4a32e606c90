"""Real Snakemake on a small CPU config: runs, re-runs nothing, re-runs exactly what changed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from codl.config import build_plan
from codl.figures import plan_figures
from codl.paths import FIGURE_FORMATS, ResultPaths
from codl.steps.analysis import CALL_COLUMNS
from shellenv import without_venv

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

CONFIG = {
    "defaults": {
        "workload": {"batch_size": 4, "image_size": 32},
        "dataset": {"name": "wf-jpeg", "samples": 32, "height": 40, "width": 48},
        "loader": {"workers": 2},
        "steps": {"warmup": 1, "measured": 3},
    },
    "experiments": [
        {
            "name": "iso",
            "factors": {"mode": ["data", "compute", "combined"], "pinning.policy": ["none"]},
        }
    ],
}


def snakemake(
    workdir: Path, config: Path, *extra: str, profile: str = "local"
) -> tuple[str, dict[str, int]]:
    # A fresh shell: the venv's bin (and its codl) not on PATH.
    env = without_venv()
    cmd = [
        str(Path(sys.executable).parent / "snakemake"),
        "-s",
        str(REPO / "workflow" / "Snakefile"),
        "-d",
        str(workdir),
        "--configfile",
        str(config),
        "--profile",
        str(REPO / "profiles" / profile),
        "--cores",
        "2",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out, job_counts(out)


def job_counts(log: str) -> dict[str, int]:
    """Jobs per rule from Snakemake's 'Job stats' table (absent when nothing runs)."""
    counts: dict[str, int] = {}
    block = log.split("Job stats:", 1)
    if len(block) < 2:
        return counts
    for line in block[1].splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


def test_workflow_runs_once_and_reruns_only_changed_specs(tmp_path: Path) -> None:
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(CONFIG))
    # The config file's name names its result set: results/config/.
    paths = ResultPaths(workdir, set_name="config")
    plan = build_plan(CONFIG)
    ids = {s.mode.value: rid for rid, s in plan.specs.items()}

    _, first = snakemake(workdir, cfg_path)
    assert first["run"] == 3
    assert first["summarize"] == 3
    assert first["dataset"] == 1
    for name in plan_figures(plan.specs.values()):
        for fmt in FIGURE_FORMATS:
            assert paths.figure(name, fmt).stat().st_size > 1000
    runs = pd.read_csv(paths.runs_table)
    assert sorted(runs["run_id"]) == sorted(ids.values())
    comparison = pd.read_csv(paths.comparison_table)
    compute_rows = comparison[(comparison["metric"] == "compute_eff_ms")]
    assert (compute_rows["status"] == "ok").all()
    assert set(compute_rows["isolation_runs"]) == {ids["compute"]}
    assert {"p50", "mean", "p95", "p99", "above_p99", "excess_share"} <= set(compute_rows["stat"])
    steps = pd.read_csv(paths.steps_table)
    assert {"outlier", "outlier_reason", "tail_step"} <= set(steps)
    # The combined run decomposed against its compute twin, step by step, from real schedstat.
    decomposition = pd.read_csv(paths.decomposition_table)
    assert set(decomposition["run_id"]) == {ids["combined"]}
    assert set(decomposition["twin_mode"]) == {"compute"}
    assert len(decomposition) == CONFIG["defaults"]["steps"]["measured"]
    assert decomposition["host_launch_delay_ms"].notna().all()
    for rid in ids.values():
        assert paths.parts(rid).exists()
    # The rules' logs say what happened: each run's progress, what each analysis step wrote.
    measured = CONFIG["defaults"]["steps"]
    total = measured["warmup"] + measured["measured"]
    run_log = paths.run_log(ids["combined"]).read_text()
    assert f"rank 0/1: step {total}/{total} (measured)" in run_log and "samples/s" in run_log
    # The rules name files relative to the working directory.
    rel = ResultPaths(set_name="config")
    assert f"wrote {rel.trace(ids['combined'])}" in run_log
    summarize_log = paths.summarize_log(ids["combined"]).read_text()
    assert f"wrote {rel.parts(ids['combined'])} (" in summarize_log
    assert f"wrote {rel.comparison_table} (" in paths.log("compare").read_text()
    assert "drawing " in paths.log("figures").read_text()

    out, second = snakemake(workdir, cfg_path)
    assert second == {}, out[-2000:]
    assert "Nothing to be done" in out

    # The per-call table only where asked: not made by the default target, and asking for it
    # runs its rule alone (CPU runs make no CUDA calls: tables with their columns, no rows).
    assert not any(paths.calls(rid).exists() for rid in ids.values())
    out, asked = snakemake(workdir, cfg_path, "all_calls")
    assert asked["calls"] == 3 and "run" not in asked and "summarize" not in asked, out[-2000:]
    for rid in ids.values():
        calls = pd.read_parquet(paths.calls(rid))
        assert list(calls.columns) == list(CALL_COLUMNS) and calls.empty
        assert f"wrote {rel.calls(rid)} (0 calls)" in paths.calls_log(rid).read_text()

    compute_trace = paths.trace(ids["compute"])
    before = compute_trace.stat().st_mtime_ns
    changed = dict(CONFIG)
    changed["defaults"] = {**CONFIG["defaults"], "loader": {"workers": 1}}
    cfg_path.write_text(yaml.safe_dump(changed))
    new_ids = set(build_plan(changed).specs)
    _, third = snakemake(workdir, cfg_path)
    # Only the two runs that load data changed spec (and so run_id); compute is untouched.
    assert third["run"] == 2
    assert third["summarize"] == 2
    assert third["compare"] == 1
    assert third.get("dataset", 0) == 0
    assert compute_trace.stat().st_mtime_ns == before
    assert len(new_ids - set(ids.values())) == 2

    report = paths.report
    snakemake(workdir, cfg_path, "--report", str(report))
    assert report.stat().st_size > 10_000

    # Another config in the same directory: its own result set, the shared runs not re-run,
    # and the first config's tables left as they were.
    first_tables = {t: t.read_bytes() for t in paths.tables.iterdir()}
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**changed, "experiments": [CONFIG["experiments"][0]]}))
    _, fourth = snakemake(workdir, other)
    assert "run" not in fourth and fourth["compare"] == 1, fourth
    other_paths = ResultPaths(workdir, set_name="other")
    assert set(pd.read_csv(other_paths.runs_table)["run_id"]) == new_ids
    assert {t: t.read_bytes() for t in paths.tables.iterdir()} == first_tables


def test_configfile_replaces_the_default_config_instead_of_merging(tmp_path: Path) -> None:
    """From the repo root, --configfile smoke.yaml must give exactly smoke.yaml's runs."""
    import json

    from codl.config import load_plan

    # A fresh shell: the venv's bin (and its codl) not on PATH.
    env = without_venv()
    smoke = REPO / "config" / "smoke.yaml"
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "snakemake"),
            "--configfile",
            str(smoke),
            "--dry-run",
            "--printshellcmds",
            "--cores",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    specs = [
        json.loads(m.group(1))
        for m in re.finditer(
            r"codl(?:\.cli)? write-spec '(\{.*?\})' --out", proc.stdout + proc.stderr
        )
    ]
    expected = load_plan(smoke).specs
    if not specs:
        pytest.skip("results of the smoke config already exist in the checkout")
    from codl.spec import RunSpec

    assert {RunSpec.from_dict(s).run_id for s in specs} <= set(expected)


def test_storage_tier_is_staged_before_the_runs_that_read_it(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    tier_dir = tmp_path / "node local ü"
    cfg = {
        "defaults": {
            **CONFIG["defaults"],
            "dataset": {**CONFIG["defaults"]["dataset"], "name": "tiered", "tier": "local"},
        },
        "tiers": {"local": str(tier_dir)},
        "experiments": [{"name": "tier", "factors": {"mode": ["data"]}}],
    }
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    out, jobs = snakemake(workdir, cfg_path)
    assert jobs["dataset"] == 1
    assert jobs["stage_dataset"] == 1
    # The run reads the staged copy, not the generated original.
    assert f"--dataset-dir '{tier_dir / 'tiered'}'" in out
    assert jobs["run"] == 1
    assert len(list((tier_dir / "tiered").rglob("*.jpg"))) == 32
    (run_id,) = build_plan(cfg).specs
    log = (workdir / "logs" / "run" / f"{run_id}.log").read_text()
    assert "Traceback" not in log
    spec = (workdir / "results" / "runs" / run_id / "spec.json").read_text()
    assert '"tier": "local"' in spec


def test_blocks_per_invocation_measure_part_of_the_plan_then_add_and_pool(tmp_path: Path) -> None:
    """A 2-block plan that may start one block per invocation: the first analyses that block
    and says "1 of 2 planned blocks"; the second adds the other and pools both."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    cfg = {
        "defaults": CONFIG["defaults"],
        "experiments": [
            {"name": "pair", "factors": {"mode": ["compute", "data+compute"]}, "repeats": 2}
        ],
        "blocks": {"per_invocation": 1},
    }
    cfg_path = tmp_path / "twoblocks.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    paths = ResultPaths(workdir, set_name="twoblocks")
    by_block: dict[int, set[str]] = {}
    for rid, spec in build_plan(cfg).specs.items():
        by_block.setdefault(spec.repeat, set()).add(rid)

    _, first = snakemake(workdir, cfg_path)
    assert first["run"] == 2 and first["compare"] == 1, first
    assert set(pd.read_csv(paths.runs_table)["run_id"]) == by_block[0]
    blocks = pd.read_csv(paths.blocks_table)
    assert list(blocks["analysed"]) == [True, False]
    assert "1 of 2 planned blocks analysed (2 of 4 runs)" in paths.log("block_progress").read_text()
    assert not any(paths.trace(rid).exists() for rid in by_block[1])

    _, second = snakemake(workdir, cfg_path)
    assert second["run"] == 2 and second["compare"] == 1, second
    runs = pd.read_csv(paths.runs_table)
    assert set(runs["run_id"]) == by_block[0] | by_block[1]
    assert list(pd.read_csv(paths.blocks_table)["analysed"]) == [True, True]
    assert "2 of 2 planned blocks analysed" in paths.log("block_progress").read_text()
    # Pooled over both blocks: the compute comparison of the loading run has one pair a block.
    comparison = pd.read_csv(paths.comparison_table)
    row = comparison[
        (comparison["metric"] == "compute_eff_ms")
        & (comparison["stat"] == "mean")
        & (comparison["mode"] == "data+compute")
    ]
    assert list(row["n_blocks"]) == [2], row[["n_blocks", "status"]]

    out, third = snakemake(workdir, cfg_path)
    assert third == {}, out[-2000:]
