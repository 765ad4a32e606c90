"""The CoDL workflow on Slurm: `snakemake --profile profiles/slurm` against the test cluster.

Each run becomes one Slurm job (sacct lists it COMPLETED), a 2-rank run starts its ranks as srun
tasks, editing one factor resubmits only the runs it changes, and a run that fails ends FAILED in
sacct, is reported by Snakemake and leaves no trace that reads as complete.

Jobs are found from Snakemake's output ("submitted with SLURM jobid N (log: .../rule_<rule>/
<wildcards>/N.log)"); the plugin names every job after the Snakemake invocation (a UUID) and puts
rule and wildcards in --comment, which slurmdbd stores only with AccountingStoreFlags=job_comment,
so sacct's SubmitLine (the sbatch line, --comment included) is what ties a job to its run here.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from codl.config import build_plan
from codl.errors import TraceFormatError
from codl.figures import plan_figures
from codl.paths import FIGURE_FORMATS, ResultPaths
from codl.pinning import parse_cpulist
from codl.trace.store import open_trace
from shellenv import without_venv

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SNAKEFILE = REPO / "workflow" / "Snakefile"
PROFILE = REPO / "profiles" / "slurm"
SNAKEMAKE_TIMEOUT_S = 600
SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+) \(log: (\S+)\)")

# Small, like config/smoke.yaml: three 1-rank modes and one 2-rank gloo run.
DEFAULTS: dict[str, Any] = {
    "device": "cpu",
    "workload": {"model": "resnet_tiny", "batch_size": 8, "image_size": 32},
    "dataset": {"name": "slurm-jpeg", "samples": 32, "height": 48, "width": 64},
    "loader": {"workers": 1},
    "steps": {"warmup": 1, "measured": 3},
}
# One CPU per rank: the 2-rank run fits the 2-core test node, and 1-rank runs go two at a time.
SLURM = {"cpus_per_rank": 1, "mem_mb_per_rank": 1500, "runtime_min": 10}


def _matrix_config(workers: int = 1) -> dict[str, Any]:
    defaults = copy.deepcopy(DEFAULTS)
    defaults["loader"]["workers"] = workers
    return {
        "defaults": defaults,
        "slurm": dict(SLURM),
        "experiments": [
            {
                "name": "single",
                "factors": {"mode": ["data", "compute", "combined"], "pinning.policy": ["none"]},
            },
            {
                "name": "ddp",
                "base": {"layout": {"ranks_per_node": 2, "backend": "gloo"}},
                "factors": {"mode": ["compute+comm"]},
            },
        ],
    }


def _write_config(path: Path, cfg: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(cfg), sort_keys=False))
    return path


def _run_ids(cfg: Mapping[str, Any]) -> dict[str, str]:
    """run_id -> mode of every run the config plans."""
    return {rid: spec.mode.value for rid, spec in build_plan(cfg).specs.items()}


@dataclass(frozen=True)
class Submission:
    job_id: str
    rule: str
    wildcards: str  # the log directory below rule_<rule>/ ("" for rules without wildcards)


@dataclass
class Workflow:
    """One `snakemake --profile profiles/slurm` invocation and what it submitted."""

    returncode: int
    output: str
    seconds: float
    submissions: list[Submission]

    def jobs(self, rule: str) -> list[Submission]:
        return [s for s in self.submissions if s.rule == rule]

    def tail(self, n: int = 6000) -> str:
        return self.output[-n:]


def _parse_submissions(output: str) -> list[Submission]:
    out = []
    for job_id, log in SUBMITTED.findall(output):
        # <workdir>/logs/slurm/rule_<rule>[/<wildcards>]/<jobid>.log (slurm-logdir of the profile)
        parts = Path(log).parts
        i = len(parts) - 1 - parts[::-1].index("slurm")
        rule_dir, *wc = parts[i + 1 : -1]
        assert rule_dir.startswith("rule_"), log
        out.append(Submission(job_id, rule_dir.removeprefix("rule_"), "/".join(wc)))
    return out


def _snakemake(env: Mapping[str, str], workdir: Path, config: Path, *extra: str) -> Workflow:
    # A fresh shell's PATH: no venv, so the jobs must find codl through the interpreter that
    # runs Snakemake (codl_command), as a user's do.
    run_env = without_venv(env)
    cmd = [
        sys.executable, "-m", "snakemake",
        "-s", str(SNAKEFILE), "-d", str(workdir), "--configfile", str(config),
        "--profile", str(PROFILE),
        *extra,
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(
        cmd,
        env=run_env,
        cwd=workdir.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=SNAKEMAKE_TIMEOUT_S,
        check=False,
    )
    (workdir.parent / f"snakemake-{int(time.time() * 1000)}.log").write_text(proc.stdout)
    return Workflow(
        proc.returncode, proc.stdout, time.monotonic() - start, _parse_submissions(proc.stdout)
    )


def _sacct(env: Mapping[str, str], job_ids: list[str], fields: str, *, allocations: bool = True):
    """Rows of `sacct -P` for ``job_ids``, one dict per line (the allocation only with -X)."""
    names = fields.split(",")
    cmd = ["sacct", "-n", "-P", "-j", ",".join(job_ids), "-o", fields]
    if allocations:
        cmd.insert(1, "-X")
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=60)
    rows = []
    for line in out.stdout.splitlines():
        if line.strip():
            rows.append(dict(zip(names, line.split("|", len(names) - 1), strict=True)))
    return rows


def _states(env: Mapping[str, str], job_ids: list[str]) -> dict[str, str]:
    """JobID -> final State; sacct may lag the job's end by a moment, so poll briefly."""
    deadline = time.monotonic() + 30
    while True:
        rows = _sacct(env, job_ids, "JobID,State")
        states = {r["JobID"]: r["State"].split()[0] for r in rows}  # "CANCELLED by 0" -> ...
        done = len(states) == len(job_ids) and all(
            s not in {"PENDING", "RUNNING", "COMPLETING"} for s in states.values()
        )
        if done or time.monotonic() > deadline:
            return states
        time.sleep(1)


# --------------------------------------------------------------------------- the matrix, twice


@pytest.fixture(scope="module")
def matrix(slurm_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    """The small matrix run once through the Slurm profile; yields (env, workdir, cfg, result)."""
    for var in ("SLURM_CONF", "CODL_SLURM_PARTITION", "CODL_SLURM_ACCOUNT"):
        assert slurm_env.get(var), f"{var} missing from the test cluster's env.sh"
    base = tmp_path_factory.mktemp("slurm-matrix")
    cfg = _matrix_config(workers=1)
    config = _write_config(base / "config.yaml", cfg)
    workdir = base / "work"
    result = _snakemake(slurm_env, workdir, config)
    print(f"first workflow: {result.seconds:.0f} s, {len(result.submissions)} Slurm jobs")
    assert result.returncode == 0, result.tail()
    return slurm_env, workdir, cfg, result


def test_every_job_is_a_completed_slurm_job(matrix) -> None:
    env, workdir, cfg, wf = matrix
    runs = _run_ids(cfg)
    # One Slurm job per run (no retries were needed) and one per data set; the light rules
    # (`spec`, `summarize`, `compare`, `figures`, `all`) are local rules, run by Snakemake itself.
    assert sorted(s.wildcards for s in wf.jobs("run")) == sorted(runs), wf.tail()
    assert {s.rule for s in wf.submissions} == {"dataset", "run"}
    for rid in runs:
        assert (workdir / "results" / "runs" / rid / "steps.parquet").is_file(), rid
    states = _states(env, [s.job_id for s in wf.submissions])
    assert states == {s.job_id: "COMPLETED" for s in wf.submissions}
    # The same jobs, as the plugin left their logs (slurm-keep-successful-logs).
    for s in wf.jobs("run"):
        assert (workdir / "logs" / "slurm" / "rule_run" / s.wildcards / f"{s.job_id}.log").is_file()


def test_resources_map_to_sbatch_flags(matrix) -> None:
    env, _workdir, cfg, wf = matrix
    runs = build_plan(cfg).specs
    jobs = {s.job_id: s for s in wf.submissions}
    rows = _sacct(env, list(jobs), "JobID,Partition,Account,AllocCPUS,SubmitLine")
    assert len(rows) == len(jobs)
    for row in rows:
        line = row["SubmitLine"]
        s = jobs[row["JobID"]]
        assert row["Partition"] == env["CODL_SLURM_PARTITION"], line
        assert row["Account"] == env["CODL_SLURM_ACCOUNT"], line
        # CPU-only workflow: no GPU flags at all (a `gpu=0` resource must not become --gpus=0).
        assert "--gpus" not in line and "--gres" not in line and "-per-gpu" not in line, line
        # No flag with a zero or empty count (resources a rule leaves unset default to 0).
        assert not re.search(r"--(nodes|ntasks|cpus-per-task|mem)[= ]0\b", line), line
        assert not re.search(r"--[a-z-]+=(None|)(\s|$)", line), line
        if s.rule != "run":
            assert "--cpus-per-task=1" in line, line
            continue
        spec = runs[s.wildcards]
        ranks = spec.layout.world_size
        assert f"--comment rule_run_wildcards_{s.wildcards}" in line, line
        assert f"--nodes={spec.layout.nodes}" in line, line
        assert f"--ntasks={ranks}" in line, line
        assert f"--cpus-per-task={SLURM['cpus_per_rank']}" in line, line
        assert f"--mem {SLURM['mem_mb_per_rank'] * ranks}" in line, line
        assert f"-t {SLURM['runtime_min']}" in line, line
        assert int(row["AllocCPUS"]) == SLURM["cpus_per_rank"] * ranks, row


def test_two_rank_run_starts_one_srun_task_per_rank(matrix) -> None:
    env, workdir, cfg, wf = matrix
    specs = build_plan(cfg).specs
    (ddp,) = [rid for rid, spec in specs.items() if spec.layout.world_size == 2]
    (job,) = [s.job_id for s in wf.jobs("run") if s.wildcards == ddp]
    # `codl run` re-ran itself as `srun --ntasks=2` inside the job: a step of 2 tasks.
    steps = _sacct(env, [job], "JobID,NTasks,State", allocations=False)
    assert any(
        r["JobID"].startswith(f"{job}.") and r["JobID"].split(".")[1].isdigit()
        and r["NTasks"] == "2" and r["State"] == "COMPLETED"
        for r in steps
    ), steps  # fmt: skip
    with open_trace(workdir / "results" / "runs" / ddp / "trace.h5") as t:
        assert sorted(int(r) for r in t.table("events/app")["rank"].unique()) == [0, 1]
        assert int(t.attrs["world_size"]) == 2
        ranks = t.attrs["ranks"]
    # Slurm bound each task to its own cpus_per_rank CPU (task/affinity, mask_cpu): each rank
    # took that set whole, shared by no other rank, instead of splitting it again.
    assert [int(r["cpus_split"]) for r in ranks] == [1, 1], ranks
    sets = [parse_cpulist(r["allowed_cpus"]) for r in ranks]
    assert [len(s) for s in sets] == [SLURM["cpus_per_rank"]] * 2, sets
    assert not sets[0] & sets[1], sets
    # Every other run: a complete trace of one rank.
    for rid in specs:
        if rid == ddp:
            continue
        with open_trace(workdir / "results" / "runs" / rid / "trace.h5") as t:
            assert sorted(int(r) for r in t.table("events/app")["rank"].unique()) == [0], rid


def test_tables_and_figures_exist(matrix) -> None:
    _env, workdir, cfg, _wf = matrix
    for rid in _run_ids(cfg):
        assert (workdir / "results" / "runs" / rid / "summary.parquet").stat().st_size > 0
    paths = ResultPaths(workdir, set_name="config")
    tables = paths.tables
    assert (tables / "runs.csv").stat().st_size > 0
    assert (tables / "comparison.csv").stat().st_size > 0
    for name in plan_figures(build_plan(cfg).specs.values()):
        for fmt in FIGURE_FORMATS:
            assert paths.figure(name, fmt).stat().st_size > 0


def test_changed_factor_resubmits_only_affected_runs(matrix) -> None:
    """Runs last in this module: it changes the matrix's working directory."""
    env, workdir, cfg, _wf = matrix
    before = _run_ids(cfg)
    cfg2 = _matrix_config(workers=2)
    after = _run_ids(cfg2)
    changed = {rid: mode for rid, mode in after.items() if rid not in before}
    kept = {rid: mode for rid, mode in after.items() if rid in before}
    # loader.workers is part of the identity of loading runs only.
    assert sorted(changed.values()) == ["combined", "data"]
    assert sorted(kept.values()) == ["compute", "compute+comm"]
    kept_mtimes = {
        rid: (workdir / "results" / "runs" / rid / "trace.h5").stat().st_mtime_ns for rid in kept
    }

    config = _write_config(workdir.parent / "config-workers2.yaml", cfg2)
    wf = _snakemake(env, workdir, config)
    print(f"second workflow: {wf.seconds:.0f} s, {len(wf.submissions)} Slurm jobs")
    assert wf.returncode == 0, wf.tail()
    assert sorted(s.wildcards for s in wf.jobs("run")) == sorted(changed), wf.tail()
    # summarize is a local rule: no Slurm job, but the changed runs' tables are rewritten.
    assert not wf.jobs("summarize"), wf.tail()
    for rid in changed:
        steps = workdir / "results" / "runs" / rid / "steps.parquet"
        assert steps.stat().st_mtime_ns >= (steps.parent / "trace.h5").stat().st_mtime_ns, rid
    # Same data set: not generated again.
    assert not wf.jobs("dataset"), wf.tail()
    states = _states(env, [s.job_id for s in wf.submissions])
    assert states == {s.job_id: "COMPLETED" for s in wf.submissions}
    for rid, mtime in kept_mtimes.items():
        assert (workdir / "results" / "runs" / rid / "trace.h5").stat().st_mtime_ns == mtime, rid
    for rid in changed:
        with open_trace(workdir / "results" / "runs" / rid / "trace.h5") as t:
            assert len(t.table("events/app")) > 0


# --------------------------------------------------------------------------- a failing run


def test_failing_run_is_failed_in_sacct_and_leaves_no_complete_trace(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    # policy `isolated` keeps launch_cores=2 for the launch roles, but the job gets
    # cpus_per_rank=1 CPU: the run passes validation and fails at start with a PlacementError.
    # Policy `none` ignores launch_cores: that run must complete all the same (keep-going).
    cfg = {
        "defaults": {**copy.deepcopy(DEFAULTS), "mode": "compute", "pinning": {"launch_cores": 2}},
        "slurm": dict(SLURM),
        "experiments": [{"name": "fails", "factors": {"pinning.policy": ["isolated", "none"]}}],
    }
    specs = build_plan(cfg).specs
    (bad,) = [rid for rid, s in specs.items() if s.pinning.policy.value == "isolated"]
    (good,) = [rid for rid in specs if rid != bad]
    config = _write_config(tmp_path / "config.yaml", cfg)
    workdir = tmp_path / "work"
    # --retries 0: the failure is deterministic; the profile's 2 retries would only repeat it.
    wf = _snakemake(slurm_env, workdir, config, "--retries", "0")
    print(f"failing workflow: {wf.seconds:.0f} s, {len(wf.submissions)} Slurm jobs")

    assert wf.returncode != 0, wf.tail()
    # An error block is its header line plus the indented lines under it; later output (other
    # jobs' submissions) must not count as part of it.
    errors = [
        "\n".join(
            [
                b.splitlines()[0],
                *itertools.takewhile(lambda ln: ln.startswith((" ", "\t")), b.splitlines()[1:]),
            ]
        )
        for b in wf.output.split("Error in rule ")[1:]
        if b.startswith("run:")
    ]
    assert any(f"results/runs/{bad}/" in b for b in errors), wf.tail()
    assert not any(f"results/runs/{good}/" in b for b in errors), wf.tail()
    (bad_job,) = [s.job_id for s in wf.jobs("run") if s.wildcards == bad]
    (good_job,) = [s.job_id for s in wf.jobs("run") if s.wildcards == good]
    assert _states(slurm_env, [bad_job, good_job]) == {bad_job: "FAILED", good_job: "COMPLETED"}
    run_log = (workdir / "logs" / "run" / f"{bad}.log").read_text()
    assert "PlacementError" in run_log or "launch_cores=2" in run_log, run_log[-3000:]

    run_dir = workdir / "results" / "runs" / bad
    assert not (run_dir / "trace.h5").exists()
    with pytest.raises(TraceFormatError):
        open_trace(run_dir / "trace.h5")
    # Whatever the failed run left (e.g. trace.incomplete.h5) is refused as a trace.
    for leftover in run_dir.glob("*.h5*"):
        with pytest.raises(TraceFormatError):
            open_trace(leftover)
    with open_trace(workdir / "results" / "runs" / good / "trace.h5") as t:
        assert len(t.table("events/app")) > 0


# --------------------------------------------------------------------------- a requeued run


def test_requeued_run_starts_cleanly_and_completes(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    """`scontrol requeue` (what preemption does) mid-run: the job restarts from scratch and the
    workflow still ends with one complete trace; the interrupted attempt left only a trace
    marked incomplete."""
    defaults = copy.deepcopy(DEFAULTS)
    defaults["mode"] = "compute"
    defaults["steps"] = {"warmup": 1, "measured": 400}
    cfg = {
        "defaults": defaults,
        "slurm": dict(SLURM),
        "experiments": [{"name": "long", "factors": {"pinning.policy": ["none"]}}],
    }
    (run_id,) = build_plan(cfg).specs
    config = _write_config(tmp_path / "config.yaml", cfg)
    workdir = tmp_path / "work"
    run_env = {**slurm_env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{slurm_env['PATH']}"}
    cmd = [
        sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir),
        "--configfile", str(config), "--profile", str(PROFILE), "--retries", "0",
    ]  # fmt: skip
    log = tmp_path / "snakemake.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, env=run_env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            job_id = ""
            run_log = workdir / "logs" / "run" / f"{run_id}.log"
            deadline = time.monotonic() + 240
            # Wait until the run is on a node and past start-up (its Snakemake log names it).
            while time.monotonic() < deadline and proc.poll() is None:
                found = [s.job_id for s in _parse_submissions(log.read_text()) if s.rule == "run"]
                if found and run_log.exists():
                    job_id = found[0]
                    states = _sacct(slurm_env, [job_id], "JobID,State")
                    if states and states[0]["State"] == "RUNNING":
                        break
                time.sleep(1)
            assert job_id, log.read_text()[-3000:]
            time.sleep(8)
            subprocess.run(["scontrol", "requeue", job_id], env=slurm_env, check=True, timeout=30)
            # Slurm keeps a requeued batch job ineligible for ~2 minutes; the test waits it out.
            proc.wait(timeout=SNAKEMAKE_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    output = log.read_text()
    assert proc.returncode == 0, output[-4000:]
    # -D lists every attempt of the job: the requeued one, then the one that completed.
    attempts = subprocess.run(
        ["sacct", "-X", "-D", "-n", "-P", "-j", job_id, "-o", "JobID,State"],
        env=slurm_env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    states = [line.split("|")[1] for line in attempts]
    assert states[0] == "REQUEUED", states
    assert states[-1] == "COMPLETED", states
    run_dir = workdir / "results" / "runs" / run_id
    with open_trace(run_dir / "trace.h5") as t:
        t.verify()
        steps = t.table("events/app")
        assert (steps["phase"].astype(str) == "step").sum() == 401
    # The interrupted attempt may have left its measured steps, never as a complete trace.
    for kept in run_dir.glob("*.incomplete.h5"):
        with pytest.raises(TraceFormatError):
            open_trace(kept).close()
