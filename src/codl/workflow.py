"""What the Snakemake rules need beyond paths: data-set locations and per-run resources."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from codl.config import Plan
from codl.paths import ResultPaths
from codl.spec import DeviceKind, RunSpec, to_dict


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
