"""What the Snakemake rules need beyond paths: data-set locations, per-run resources, and the
files and resources of the optional `advisor` and `share` sections."""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from codl.advisor.settings import advisor_settings, share_settings, share_specs
from codl.config import BlockSlot, Plan
from codl.figures import FigureName
from codl.paths import FIGURE_FORMATS, ResultPaths
from codl.spec import DeviceKind, RunSpec, to_dict

log = logging.getLogger(__name__)

# The variable through which every rule's shell command names its Python: `"$CODL_PYTHON" -m
# codl.cli ...`. An environment variable rather than a Snakefile global: a shell command sees the
# globals of the main Snakefile only (not of codl's when it runs as a module), and a path inside
# the command's text would make Snakemake's code trigger re-run every run when the venv moves.
CODL_PYTHON = "CODL_PYTHON"


def codl_python(executable: str, *, conda: bool) -> str:
    """The Python whose ``codl`` a rule runs: the interpreter running Snakemake.

    Never the caller's PATH: a user may run ``.venv/bin/snakemake`` without activating the
    venv, and a Slurm job's PATH is whatever the submitting shell had. Slurm jobs re-run
    Snakemake with this same interpreter (the executor's ``sys.executable``), which sets the
    variable again there. Under ``--use-conda`` the rule runs in the environment of
    ``envs/codl.yaml``, which installs codl, and that environment's ``python`` is the one meant.
    """
    return "python" if conda else executable


def measured_run(paths: ResultPaths) -> Callable[[str], bool]:
    """Whether a run is measured: its trace exists (a trace appears whole or not at all)."""
    return lambda run_id: paths.trace(run_id).is_file()


def dataset_dir(paths: ResultPaths, tiers: Mapping[str, str], name: str, tier: str) -> Path:
    """Where a run reads data set ``name`` from: resources/datasets/ or the tier's directory.

    ``tiers`` are the plan's, already expanded and checked by ``codl.config.resolve_tiers``;
    expanding here again would let a value of an environment variable be expanded twice.
    """
    if tier == "default":
        return paths.dataset_dir(name)
    return Path(tiers[tier]) / name


def dataset_arg(paths: ResultPaths, tiers: Mapping[str, str], spec: RunSpec) -> str:
    """The ``--dataset-dir DIR`` words of a run's shell command, quoted for the shell."""
    if not spec.mode.loads:
        return ""
    return shlex.join(
        ["--dataset-dir", str(dataset_dir(paths, tiers, spec.dataset.name, spec.dataset.tier))]
    )


def dataset_input(paths: ResultPaths, spec: RunSpec) -> list[str]:
    """The file a run waits for: the manifest (default tier) or the staging marker."""
    if not spec.mode.loads:
        return []
    if spec.dataset.tier == "default":
        return [str(paths.dataset_manifest(spec.dataset.name))]
    return [str(paths.staged_marker(spec.dataset.tier, spec.dataset.name))]


def dataset_spec_json(plan: Plan, name: str) -> str:
    for (dname, _tier), spec in plan.datasets().items():
        if dname == name:
            return json.dumps(to_dict(spec), sort_keys=True)
    raise KeyError(f"no run of the config reads data set {name!r}")


def block_after(paths: ResultPaths, slots: Mapping[str, BlockSlot], run_id: str) -> list[str]:
    """The trace a run of a block waits for: its predecessor's, so that the block's runs go in
    the planned order (codl.config.plan_blocks); none for a block's first run or without
    blocks. A rerun of one run reruns the rest of its block: a block is measured as one."""
    slot = slots.get(run_id)
    if slot is None or slot.previous is None:
        return []
    return [str(paths.trace(slot.previous))]


def block_group(slots: Mapping[str, BlockSlot], run_id: str) -> str | None:
    """The Snakemake group of a run: its block's name, so that under Slurm a block is one job
    (one allocation on one node) running its chained runs in order; None without blocks."""
    slot = slots.get(run_id)
    return slot.block if slot is not None else None


def run_resources(spec: RunSpec, slurm: Mapping[str, Any], attempt: int) -> dict[str, Any]:
    """Slurm resources of one run job: one task per rank, GPUs per rank, attempt-scaled limits."""
    ranks = spec.layout.ranks_per_node
    gpus = int(slurm.get("gpus_per_rank", 1)) if spec.device is DeviceKind.CUDA else 0
    out: dict[str, Any] = {
        "nodes": spec.layout.nodes,
        "tasks": spec.layout.world_size,
        "cpus_per_task": int(slurm.get("cpus_per_rank", 2)),
        "mem_mb": int(slurm.get("mem_mb_per_rank", 4000)) * ranks * attempt,
        "runtime": int(slurm.get("runtime_min", 30)) * attempt,
    }
    if spec.layout.world_size > 1:
        # With `mpi` set the Slurm plugin runs the command once in the batch step instead of
        # wrapping it in `srun -n1`; `codl run` then starts one task per rank itself. Only with
        # several ranks: the plugin refuses `mpi` with tasks=1 ("For MPI jobs, 'tasks' must be
        # greater than 1"), and one rank needs no srun of its own.
        out["mpi"] = "srun"
    if gpus:
        # sbatch --gpus=N with one task per GPU (the plugin's default ties --ntasks-per-gpu to
        # `tasks`, which would start tasks x GPUs ranks).
        out["gpu"] = gpus * spec.layout.world_size
        out["tasks_per_gpu"] = 1
    return out


def advisor_targets(cfg: Mapping[str, Any], paths: ResultPaths) -> list[str]:
    """The files the workflow makes for the ``advisor`` section (none without one)."""
    s = advisor_settings(cfg)
    out: list[Path] = []
    if s.map:
        out += [
            paths.map_table,
            *(paths.figure(FigureName.INTERFERENCE_MAP, f) for f in FIGURE_FORMATS),
        ]
    if s.advise:
        out += [paths.advice_text, paths.verify_config, paths.predictions_table]
    if s.calibrate:
        out += [paths.probe_config, paths.calibration_table]
        out += [paths.advice_text, paths.verify_config, paths.predictions_table]
    if s.predictions:
        out += [paths.predicted_vs_measured_table]
        out += [paths.figure(FigureName.PREDICTED_VS_MEASURED, f) for f in FIGURE_FORMATS]
        if ResultPaths.calibrated_set_of(s.predictions) is not None:
            out += [paths.blind_table, paths.blind_summary]  # rules/advise.smk, blind_error
    if share_settings(cfg).jobs:
        out += [paths.share_rows, paths.share_table]
        out += [paths.figure(FigureName.SHARE, f) for f in FIGURE_FORMATS]
    return [str(p) for p in out]


def calibrate_inputs(cfg: Mapping[str, Any]) -> list[str]:
    """What the ``advisor.calibrate`` rules read of the fit: its merged tables and, when there,
    the config its runs came from (a change reruns the probe config and the calibration)."""
    fit = Path(advisor_settings(cfg).calibrate)
    config = fit / "config.yaml"
    return [str(p) for p in ResultPaths.merged_tables_of(fit)] + (
        [str(config)] if config.is_file() else []
    )


def calibrate_options(cfg: Mapping[str, Any]) -> str:
    """``codl advise`` options of the ``advisor.calibrate`` rules, from the ``advisor``
    section: the probe config the ``probe_config`` rule writes is then the one the workflow
    planned (``steps.advisor.probe_workflow_config``, same core budget and tie rule)."""
    s = advisor_settings(cfg)
    cores = f"--cores {s.cores} " if s.cores else ""
    return f"{cores}--prefer {s.prefer} --repeats {s.repeats}"


def share_inputs(cfg: Mapping[str, Any], plan: Plan, paths: ResultPaths) -> list[str]:
    """The data sets the shared-node jobs read, and the tables the advised split is fitted on:
    the `share` rule waits for them and reruns when they change."""
    out = {f for s in share_specs(cfg, plan).values() for f in dataset_input(paths, s)}
    for d in share_settings(cfg).advise_from:
        out |= {str(t) for t in ResultPaths.merged_tables_of(Path(d))}
    return sorted(out)


def share_resources(cfg: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """Slurm resources of the `share` rule: one task on one node held alone (``--exclusive``:
    a job of somebody else on the node's cores would be part of the experiment), the
    ``slurm.cpus_per_rank`` CPUs the jobs split, one GPU per CUDA job, the jobs' memory, and a
    time limit for every split and repeat. Without a `share` section: {}."""
    settings = share_settings(cfg)
    if not settings.jobs:
        return {}
    specs = list(share_specs(cfg, plan).values())
    slurm = cfg.get("slurm") or {}
    splits = len(settings.splits) + bool(settings.advised or settings.advise_from)
    splits += len(settings.fixed)
    gpus = sum(1 for s in specs if s.device is DeviceKind.CUDA)
    return {
        "nodes": 1,
        "tasks": 1,
        "cpus_per_task": int(slurm.get("cpus_per_rank", 2)),
        "mem_mb": int(slurm.get("mem_mb_per_rank", 4000)) * len(specs),
        "runtime": int(slurm.get("runtime_min", 30)) * splits * settings.repeats,
        # sbatch --gpus=N for one task; 0 tasks per GPU leaves --ntasks-per-gpu unset (the
        # plugin would otherwise tie it to `tasks` and start a task per GPU).
        "gpu": gpus,
        "tasks_per_gpu": 0,
        "slurm_extra": "--exclusive",
    }


# What common.smk asks of the block experiment's, GIL and slow-call rules: here, not in their
# step modules, which load pandas and matplotlib (seconds at every parse of the Snakefile).


def sched_event_runs(specs: Mapping[str, RunSpec], analysed: Iterable[str]) -> list[str]:
    """The analysed runs (in their order) that record the scheduler's events: without the
    record a run has no sleeps to classify, and a row of zeros would read as no GIL wait."""
    return [rid for rid in analysed if specs[rid].trace.sched_events]


def gil_targets(paths: ResultPaths, runs: Sequence[str]) -> list[str]:
    """The rule's output for the default target: none when no analysed run has the record."""
    return [str(paths.gil_runs_table)] if runs else []


def pooled_targets(paths: ResultPaths, parent: ResultPaths | None = None) -> list[str]:
    """The ``pooled`` rule's outputs, for the default target of a config with a ``blocks``
    section; with ``parent``, the ``pool_invocations`` rule's too (its set's pooled tables)."""
    pooled = [
        paths.pooled_runs_table,
        paths.pooled_inflation_table,
        paths.pooled_throughput_table,
        paths.pooled_efficiency_table,
        *(paths.intervention_figure(fmt) for fmt in FIGURE_FORMATS),
        *(paths.efficiency_figure(fmt) for fmt in FIGURE_FORMATS),
    ]
    if parent is not None:
        pooled += [
            parent.pooled_inflation_table,
            parent.pooled_throughput_table,
            parent.pooled_levels_table,
        ]
    return [str(p) for p in pooled]


def slow_call_twins(specs: Mapping[str, RunSpec], analysed: Iterable[str]) -> dict[str, str]:
    """Each analysed run with the calls' evidence that loads and computes -> its compute twin
    (``Mode.compute_twin``), where the twin is analysed too: a slow call is one far above the
    twin's median for its API name, so a run without its twin has no baseline to be slow
    against, and the twin itself is the baseline, not a run to attribute."""
    ids = list(analysed)
    present = set(ids)
    out: dict[str, str] = {}
    for rid in ids:
        spec = specs[rid]
        twin_mode = spec.mode.compute_twin
        if not spec.trace.cuda_api_sched or twin_mode is None:
            continue
        twin = spec.with_mode(twin_mode).run_id
        if twin in present:
            out[rid] = twin
        else:
            log.warning("run %s: its compute twin %s is not analysed; no slow calls", rid, twin)
    return out


def slow_calls_targets(paths: ResultPaths, twins: Mapping[str, str]) -> list[str]:
    """The rule's output for the default target: none without a run to attribute."""
    return [str(paths.slow_calls_table)] if twins else []
