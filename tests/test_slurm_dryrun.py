"""The GPU configs under the Slurm profile, without a cluster: a dry-run resolves every job's
resources, so a config that would submit the wrong shape of job fails here, on any machine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from codl.config import build_plan, load_yaml
from codl.spec import Mode
from test_workflow import job_counts, snakemake

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

# Snakemake's dry-run prints one block per job; the `resources:` line of a run job holds what the
# Slurm plugin turns into sbatch flags (tasks -> --ntasks, gpu + tasks_per_gpu -> --gpus and
# --ntasks-per-gpu, mpi=srun -> one srun step that starts every rank).
_JOB = re.compile(r"^rule (\w+):\n(.*?)(?=^\[|\Z)", re.S | re.M)
_RESOURCES = re.compile(r"^\s+resources: (.*)$", re.M)


def dry_run(config: Path, workdir: Path) -> str:
    log, _ = snakemake(workdir, config, "--dry-run", profile="slurm")
    return log


def run_job_resources(log: str) -> list[dict[str, str]]:
    jobs = []
    for rule, body in _JOB.findall(log):
        if rule != "run":
            continue
        m = _RESOURCES.search(body)
        assert m, body
        pairs = (item.split("=", 1) for item in m.group(1).split(", "))
        jobs.append({k: v for k, v in pairs})
    return jobs


def test_two_gpu_config_submits_one_two_task_job_per_run(tmp_path: Path) -> None:
    config = REPO / "config" / "h200x2.yaml"
    plan = build_plan(load_yaml(config), source=str(config))
    jobs = run_job_resources(dry_run(config, tmp_path))
    assert len(jobs) == len(plan.specs) > 0
    for res in jobs:
        # One node, one task per rank, one GPU per task, the ranks started by one srun step.
        assert res["nodes"] == "1"
        assert res["tasks"] == "2"
        assert res["gpu"] == "2"
        assert res["tasks_per_gpu"] == "1"
        assert res["mpi"] == "srun"
        assert res["cpus_per_task"] == "16"


def test_two_gpu_config_meets_the_reproduction_minimums() -> None:
    config = REPO / "config" / "h200x2.yaml"
    specs = list(build_plan(load_yaml(config), source=str(config)).specs.values())
    assert all(s.steps.measured >= 200 for s in specs)
    assert all(s.layout.world_size == 2 and s.layout.backend.value == "nccl" for s in specs)
    # Every (mode, policy, workers, CUPTI level) combination has at least 3 repeats.
    combos: dict[tuple[object, ...], int] = {}
    for s in specs:
        key = (s.mode, s.pinning.policy, s.loader.workers, s.trace.cuda_api)
        combos[key] = combos.get(key, 0) + 1
    assert min(combos.values()) >= 3, combos
    # Every combined run has its compute+comm twin (same policy, same CUPTI level), the
    # decomposition's baseline, and the components alone exist under `none`.
    for s in specs:
        if s.mode.value == "combined":
            twin = s.with_mode(Mode.COMPUTE_COMM)
            assert twin.run_id in {t.run_id for t in specs}, s
    assert {s.mode.value for s in specs} >= {"comm", "compute", "data"}
    assert any(s.trace.cuda_api for s in specs)


def local_rules(config: Path, workdir: Path) -> set[str]:
    """Rules Snakemake runs where it runs instead of submitting (its own `is_local`: localrules,
    and rules without a body, such as `all`)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    with SnakemakeApi(OutputSettings(quiet=True)) as api:
        wf = api.workflow(
            resource_settings=ResourceSettings(cores=2),
            config_settings=ConfigSettings(configfiles=[config]),
            snakefile=REPO / "workflow" / "Snakefile",
            workdir=workdir,
        )
        # The API exposes no rule list. Workflow.is_local answers True for every rule when the
        # executor is local (as here); under a remote executor it is this expression.
        workflow = wf._workflow
        return {
            r.name
            for r in workflow.rules
            if r.group is None and (r.name in workflow._localrules or r.norun)
        }


def test_only_runs_and_data_sets_become_sbatch_jobs(tmp_path: Path) -> None:
    config = REPO / "config" / "config.yaml"
    plan = build_plan(load_yaml(config), source=str(config))
    counts = job_counts(dry_run(config, tmp_path))
    local = local_rules(config, tmp_path)
    assert {"spec", "summarize", "compare", "figures", "all"} <= local
    assert not {"run", "dataset", "stage_dataset"} & local
    sbatch = {rule: n for rule, n in counts.items() if rule not in local and rule != "total"}
    datasets = {s.dataset.name for s in plan.specs.values() if s.mode.loads}
    # One sbatch job per run and per data set to generate; before, every summarize, compare,
    # figures (and spec) job was one more (38 summarize jobs for this config).
    assert sbatch == {"run": len(plan.specs), "dataset": len(datasets)}
    assert counts["summarize"] == len(plan.specs)


def test_the_shared_node_rule_holds_a_whole_node(tmp_path: Path) -> None:
    """config/share-h200x2.yaml under the Slurm profile: the `share` rule is one exclusive job
    with the CPUs the jobs split and a GPU per job; the fitted tables it reads are inputs."""
    for name in ("loop-h200", "loop-h200-jpeg"):
        (tmp_path / "results").mkdir(exist_ok=True)
        (tmp_path / "results" / name).symlink_to(REPO / "results" / name)
    log = dry_run(REPO / "config" / "share-h200x2.yaml", tmp_path)
    blocks = {rule: body for rule, body in _JOB.findall(log)}
    assert "share" in blocks, log[-2000:]
    m = _RESOURCES.search(blocks["share"])
    assert m
    res = dict(item.split("=", 1) for item in m.group(1).split(", "))
    assert res["nodes"] == "1" and res["tasks"] == "1"
    assert res["cpus_per_task"] == "32" and res["gpu"] == "2" and res["tasks_per_gpu"] == "0"
    assert res["slurm_extra"] == "--exclusive"
    assert res["mem_mb"] == "128000"
    # 4 splits (none, even, advised: counted, its shares are fitted when the rule runs; the
    # named 8/24) x 3 repeats x 30 min.
    assert res["runtime"] == str(30 * 4 * 3)
    assert "results/loop-h200-jpeg/tables/runs.csv" in blocks["share"]


def test_only_multi_rank_run_jobs_declare_mpi(tmp_path: Path) -> None:
    """The Slurm jobstep plugin runs a job's command under `srun -n1 --cpu-bind=q ...` unless
    the job declares `mpi` at all (it checks the key, not its value); a one-rank run must get
    that srun and its CPU binding, a multi-rank run must start its ranks with one srun itself."""
    cfg = {
        "defaults": {
            "dataset": {"name": "mpi-jpeg", "samples": 32, "height": 40, "width": 48},
            "steps": {"warmup": 1, "measured": 3},
        },
        "slurm": {"cpus_per_rank": 1},
        "experiments": [
            {"name": "one", "factors": {"mode": ["data", "compute", "combined"]}},
            {
                "name": "two",
                "base": {"layout": {"ranks_per_node": 2, "backend": "gloo"}},
                "factors": {"mode": ["compute+comm"]},
            },
        ],
    }
    config = tmp_path / "mpi.yaml"
    config.write_text(yaml.safe_dump(cfg))
    specs = build_plan(cfg).specs
    workdir = tmp_path / "work"
    workdir.mkdir()
    log = dry_run(config, workdir)
    jobs = {}
    for rule, body in _JOB.findall(log):
        if rule == "run":
            run_id = re.search(r"results/runs/([0-9a-f]{12})/", body)
            m = _RESOURCES.search(body)
            assert run_id and m, body
            jobs[run_id.group(1)] = dict(item.split("=", 1) for item in m.group(1).split(", "))
    assert set(jobs) == set(specs)
    ranks = {rid: s.layout.world_size for rid, s in specs.items()}
    assert sorted(ranks.values()) == [1, 1, 1, 2]
    for rid, res in jobs.items():
        assert res["tasks"] == str(ranks[rid])
        if ranks[rid] == 1:
            assert "mpi" not in res, res
        else:
            assert res["mpi"] == "srun", res
