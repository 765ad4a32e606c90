"""Sharing a node (A-Dloader's setting): training jobs started together, each confined to its
share of the node's CPUs, each traced; per-job and total throughput per way of splitting.

Splits of the CPUs ``os.sched_getaffinity(0)`` allows (or of its first ``share.cpus``, the
pool):

- ``none``: every job may run on every CPU (the OS scheduler decides, as on an unmanaged node);
- ``even``: equal contiguous shares (the remainder to the first jobs);
- ``advised``: shares chosen by ``advise.advise_split`` from each job's fitted model (the split
  that maximises the summed throughput, each job's relative to its best on the whole node).

Each job is a ``codl run`` process whose affinity is set before it starts, so its CPU-set policy
splits only its share (``pinning`` never widens a mask beyond the job's). A CUDA job gets a GPU
of its own (``CUDA_VISIBLE_DEVICES``, in job order): jobs share the node's CPUs, not a GPU, as
A-Dloader's single-GPU jobs on one node do. Jobs start together and are waited for together; a
job that fails fails the experiment with its last stderr lines.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.advisor.settings import ShareSettings, share_settings, share_specs
from codl.blas import users_env
from codl.config import build_plan
from codl.errors import CodlError
from codl.figures import FigureName
from codl.outputs import output_unit
from codl.paths import ResultPaths, ShareFiles
from codl.pinning import cpulist
from codl.spec import DeviceKind, RunSpec
from codl.steps.workflow import dataset_dir
from codl.trace.store import set_aside_stale

_LOG = logging.getLogger(__name__)
SPLITS = ("none", "even", "advised")
_CONFINE = (
    "import os, sys; os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')]); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)
# A job's stderr tail in the error of a failed experiment: enough for the one-line error codl
# prints, short enough to read.
_STDERR_TAIL = 2000


def cpu_shares(
    cpus: Sequence[int], counts: Sequence[int] | None, *, jobs: int
) -> list[tuple[int, ...]]:
    """Contiguous shares of ``cpus`` of the given sizes; ``None``: every job gets all of them."""
    ordered = tuple(sorted(cpus))
    if counts is None:
        return [ordered] * jobs
    if len(counts) != jobs:
        raise CodlError(f"CPU split {list(counts)}: expected one share per job ({jobs})")
    if any(c < 1 for c in counts) or sum(counts) > len(ordered):
        raise CodlError(
            f"CPU split {list(counts)}: expected shares >= 1 that add up to at most the "
            f"{len(ordered)} CPUs available ({list(ordered)})"
        )
    out, start = [], 0
    for c in counts:
        out.append(ordered[start : start + c])
        start += c
    return out


def share_pool(allowed: Iterable[int], cpus: int) -> list[int]:
    """The CPUs the jobs share (``share.cpus``): the first ``cpus`` of the sorted ``allowed``
    set, or all of it for 0."""
    ordered = sorted(allowed)
    if cpus > len(ordered):
        raise CodlError(
            f"share.cpus: got {cpus}, but this process may use only {len(ordered)} CPU(s) "
            f"({cpulist(ordered)}); expected at most that, or 0 for all of them"
        )
    return ordered[:cpus] if cpus else ordered


def even_counts(n_cpus: int, n_jobs: int) -> list[int]:
    if n_cpus < n_jobs:
        raise CodlError(f"{n_cpus} CPUs cannot be split between {n_jobs} jobs (>= 1 each)")
    base, extra = divmod(n_cpus, n_jobs)
    return [base + (1 if i < extra else 0) for i in range(n_jobs)]


@dataclass(frozen=True, kw_only=True)
class Job:
    """One job of a shared node: its spec, the data set it reads, where its trace goes."""

    name: str
    spec: RunSpec
    dataset_dir: Path | None
    trace: Path
    gpu: int | None = None  # the one GPU a CUDA job sees; None: the environment's


def gpus_for(specs: Sequence[RunSpec], visible: int) -> list[int | None]:
    """One GPU per CUDA job, in job order (CPU jobs get none); ``visible``: GPUs on the node."""
    cuda = [i for i, s in enumerate(specs) if s.device is DeviceKind.CUDA]
    if len(cuda) > visible:
        raise CodlError(
            f"share.jobs: {len(cuda)} CUDA jobs need a GPU each, this node shows {visible}"
        )
    out: list[int | None] = [None] * len(specs)
    for gpu, i in enumerate(cuda):
        out[i] = gpu
    return out


def job_env(job: Job, base: Mapping[str, str]) -> dict[str, str]:
    """The job's environment: ``base`` with the job's GPU the only visible one, and OpenBLAS's
    threads as the user left them (the rule's script asked for one: `codl.blas`)."""
    env = users_env(base)
    if job.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(job.gpu)
    return env


def run_together(
    jobs: Sequence[Job], shares: Sequence[tuple[int, ...]], *, timeout: float = 600
) -> None:
    """Start every job at once, job i confined to ``shares[i]``; wait for all of them."""
    if len(jobs) != len(shares):
        raise CodlError(f"{len(jobs)} jobs but {len(shares)} CPU shares")
    procs = []
    for job, cpus in zip(jobs, shares, strict=True):
        job.trace.parent.mkdir(parents=True, exist_ok=True)
        spec_path = job.trace.with_suffix(".spec.json")
        spec_path.write_text(json.dumps(job.spec.to_dict(), sort_keys=True))
        # The share is the job's whole world: set before `codl run` starts (an exec keeps the
        # mask), inherited by its threads and loader workers. No preexec_fn: it is unsafe in a
        # process with threads.
        cpulist = ",".join(str(c) for c in cpus)
        cmd = [sys.executable, "-c", _CONFINE, cpulist, "-m", "codl.cli", "run", str(spec_path)]
        cmd += ["--trace", str(job.trace)]
        cmd += ["--cpus-per-task", str(len(cpus))]
        if job.dataset_dir is not None:
            cmd += ["--dataset-dir", str(job.dataset_dir)]
        procs.append(
            subprocess.Popen(
                cmd,
                env=job_env(job, os.environ),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    failures = []
    for job, proc in zip(jobs, procs, strict=True):
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            failures.append(f"{job.name}: timed out after {timeout:.0f} s")
            continue
        if proc.returncode != 0:
            failures.append(f"{job.name}: exit {proc.returncode}: {err[-_STDERR_TAIL:].strip()}")
    if failures:
        raise CodlError("shared-node jobs failed: " + " | ".join(failures))


def measured(jobs: Sequence[Job], shares: Sequence[tuple[int, ...]]) -> bool:
    """Whether every job's trace is there, complete, of the job's spec and run on its share."""
    from codl.errors import TraceFormatError
    from codl.trace.store import open_trace

    def fits(job: Job, share: tuple[int, ...]) -> bool:
        try:
            with open_trace(job.trace) as t:
                a = t.attrs
        except TraceFormatError:
            return False
        # The job's set before a core budget (pinning.cpus) cut it (rank 0's in a merged trace,
        # whose root attributes are rank 0's); traces written before the budget: allowed_cpus.
        cpus = a.get("job_cpus", a.get("allowed_cpus"))
        return bool(a.get("run_id") == job.spec.run_id and cpus == cpulist(share))

    return all(fits(j, s) for j, s in zip(jobs, shares, strict=True))


def set_aside(jobs: Sequence[Job]) -> None:
    """Move the jobs' traces out of the way (``trace.store.set_aside_stale``) so that they can be
    written again; never deleted: they are measurements."""
    for job in jobs:
        aside = set_aside_stale(job.trace)
        if aside is not None:
            _LOG.warning("%s: not of this split's spec or CPUs; set aside as %s", job.trace, aside)


def throughput_of(trace: Path) -> float:
    """Per-rank throughput (samples/s) of one traced job, as ``summarize`` reports it."""
    from codl.steps.analysis import summarize_to

    parts = ShareFiles.job_tables(trace)
    summarize_to(trace, **parts)
    summary = pd.read_parquet(parts["summary"])
    world = float(summary["world_size"].iloc[0]) if "world_size" in summary else 1.0
    return float(summary["throughput_samples_s"].iloc[0]) / world


def share_report(
    rows: pd.DataFrame, *, advised: str | None = None, boot: int = 2000, seed: int = 0
) -> pd.DataFrame:
    """Per split: each job's throughput, the total, and each against the even split
    (``rows``: split, repeat, job, cpus, throughput). Means over repeats, with 95 % bootstrap
    intervals over repeats (``<col>_lo``/``<col>_hi``; NaN with one repeat): a split's effect on
    a shared node is a few per cent, the size of run-to-run scatter, so a mean alone misleads.
    ``speedup_<job>_vs_even`` and ``total_vs_even``: mean / even's mean, the interval resampling
    both splits' repeats independently (repeats of different splits are not paired).
    ``advised``: the split that ran the advised shares (column ``advised``)."""
    per_rep = rows.pivot_table(index=["split", "repeat"], columns="job", values="throughput")
    jobs = [str(j) for j in rows["job"].drop_duplicates()]
    per_rep = per_rep[jobs]
    per_rep["total"] = per_rep.sum(axis=1, min_count=len(jobs))
    splits = list(rows["split"].drop_duplicates())
    rng = np.random.default_rng(seed)
    draws = {
        split: _bootstrap_means(per_rep.loc[split].to_numpy(np.float64), boot, rng)
        for split in splits
    }
    out = pd.DataFrame(index=pd.Index(splits, name="split"))
    columns = [*jobs, "total"]
    for i, col in enumerate(columns):
        out[col] = [float(np.nanmean(per_rep.loc[s][col])) for s in splits]
        out[f"{col}_lo"] = [_percentile(draws[s][:, i], 2.5) for s in splits]
        out[f"{col}_hi"] = [_percentile(draws[s][:, i], 97.5) for s in splits]
    out["repeats"] = [len(per_rep.loc[s]) for s in splits]
    out["advised"] = [s == advised for s in splits]
    if "even" in splits:
        # Jobs of different models count samples of different cost: the sum of samples/s is what
        # the node delivers, the mean speedup against the even split what each job gets.
        rel = out[jobs].div(out.loc["even", jobs].astype(float), axis=1)
        out["mean_speedup_vs_even"] = rel.mean(axis=1)
        for i, col in enumerate(columns):
            name = "total_vs_even" if col == "total" else f"speedup_{col}_vs_even"
            out[name] = out[col] / out[col].loc["even"]
            ratio = {s: draws[s][:, i] / draws["even"][:, i] for s in splits}
            out[f"{name}_lo"] = [_percentile(ratio[s], 2.5) for s in splits]
            out[f"{name}_hi"] = [_percentile(ratio[s], 97.5) for s in splits]
    cpus = rows.groupby(["split", "job"], sort=False)["cpus"].first().unstack("job")
    out = out.join(cpus[jobs].add_prefix("cpus_"))
    return out.reset_index()


def _bootstrap_means(
    values: npt.NDArray[np.float64], boot: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """``boot`` x columns: column means over repeats (rows) resampled with replacement; NaN
    with fewer than 2 repeats (no interval from one run)."""
    n = len(values)
    if n < 2:
        return np.full((max(boot, 1), values.shape[1]), np.nan)
    idx = rng.integers(0, n, size=(boot, n))
    return np.asarray(np.nanmean(values[idx], axis=1), dtype=np.float64)


def _percentile(x: npt.NDArray[np.float64], q: float) -> float:
    return float(np.percentile(x, q)) if np.isfinite(x).all() else float("nan")


def run_shared(
    jobs: Sequence[Job],
    splits: Mapping[str, Sequence[int] | None],
    *,
    work: Path,
    cpus: Sequence[int] | None = None,
    repeats: int = 1,
) -> pd.DataFrame:
    """Every split of ``splits`` (name -> CPUs per job, ``None`` = no split), ``repeats`` times:
    the jobs started together on their shares of ``cpus`` (default: this process's), each
    traced under ``work/<split>/<repeat>/``; one row per (split, repeat, job).

    Repeat-major, the order of the splits rotated by one per repeat: a node's speed drifts over
    a session (docs/results-h200x2.md), and split-major order would read drift as a split's
    effect. A (split, repeat) whose traces are all there, complete, of the jobs' specs and on
    their shares is not run again (``measured``): an experiment cut short (an allocation's time
    limit, a killed Snakemake job) resumes where it stopped."""
    allowed = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    shares_of = {name: cpu_shares(allowed, c, jobs=len(jobs)) for name, c in splits.items()}
    names = list(splits)
    files = ShareFiles(Path(work))
    rows = []
    for rep in range(repeats):
        for split in names[rep % len(names) :] + names[: rep % len(names)]:
            shares = shares_of[split]
            placed = [dataclasses.replace(j, trace=files.trace(j.name, split, rep)) for j in jobs]
            if measured(placed, shares):
                _LOG.info("%s, repeat %d: traces already measured, reused", split, rep)
            else:
                set_aside(placed)
                run_together(placed, shares)
            for job, share in zip(placed, shares, strict=True):
                rows.append(
                    {
                        "split": split,
                        "repeat": rep,
                        "job": job.name,
                        "cpus": cpulist(share),
                        "throughput": throughput_of(job.trace),
                    }
                )
    return pd.DataFrame(rows)


def advised_split(results: Sequence[str], n_cpus: int, work: Path, *, boot: int = 200) -> list[int]:
    """CPUs per job: each job's model fitted on its results directory (as ``codl advise``
    does), then ``advise_split`` for this machine's ``n_cpus``; every split it scored goes to
    ``work/advised_splits.csv``."""
    from codl.advisor import advise as adv
    from codl.advisor import model as mdl
    from codl.steps.advisor import fit_results

    fits = []
    for d in results:
        try:
            fits.append(fit_results(Path(d), boot=boot).fit)
        except CodlError as exc:
            raise CodlError(f"share.advise_from: {d}: {exc}") from None
    try:
        counts, table = adv.advise_split(fits, cores=n_cpus)
    except mdl.ModelError as exc:
        raise CodlError(f"share.advise_from: {exc}") from None
    scored = ShareFiles(work).advised_splits
    with output_unit({"advised splits": scored}, mkdir=True) as unit:
        table.assign(split=[" / ".join(map(str, x)) for x in table["split"]]).to_csv(
            unit.path(scored), index=False
        )
    return counts


def _visible_gpus(specs: Any) -> int:
    """GPUs this process sees; 0 without a CUDA job (torch is not imported for CPU jobs)."""
    if not any(s.device is DeviceKind.CUDA for s in specs):
        return 0
    import torch

    return int(torch.cuda.device_count())


def splits_for(
    settings: ShareSettings, n_cpus: int, n_jobs: int, work: Path
) -> tuple[dict[str, Sequence[int] | None], str | None]:
    """The section's splits by name: ``none``/``even``, the advised one (given, or fitted from
    ``advise_from``; left out where it equals another split), then the ``fixed`` ones; and the
    name under which the advised split runs (None without one)."""
    splits: dict[str, Sequence[int] | None] = {
        split: None if split == "none" else even_counts(n_cpus, n_jobs) for split in settings.splits
    }
    advised_as: str | None = None
    if settings.advised:
        splits["advised"] = list(settings.advised)
        advised_as = "advised"
    elif settings.advise_from:
        advised = advised_split(settings.advise_from, n_cpus, work)
        same = [name for name, c in splits.items() if c is not None and list(c) == advised]
        if same:
            # The same shares under two names would count one measurement twice.
            advised_as = same[0]
            _LOG.info("advised split %s is the %s split: run once", advised, advised_as)
        else:
            splits["advised"] = advised
            advised_as = "advised"
    for name, counts in settings.fixed:
        splits[name] = list(counts)
    return splits, advised_as


def share_to(
    cfg: Mapping[str, Any],
    *,
    paths: ResultPaths,
    rows_out: Path,
    table_out: Path,
    figures: Sequence[Path],
) -> pd.DataFrame:
    """The config's ``share`` section, run: every split, the rows, the report and its figure."""
    from codl.figures.registry import FigureInputs, draw_figure

    settings = share_settings(cfg)
    plan = build_plan(cfg, source="the config")
    specs = share_specs(cfg, plan)
    gpus = gpus_for(list(specs.values()), _visible_gpus(specs.values()))
    jobs = [
        Job(
            name=name,
            spec=spec,
            dataset_dir=dataset_dir(paths, plan.tiers, spec.dataset.name, spec.dataset.tier)
            if spec.mode.loads
            else None,
            trace=paths.share_files.trace(name),
            gpu=gpu,
        )
        for (name, spec), gpu in zip(specs.items(), gpus, strict=True)
    ]
    pool = share_pool(os.sched_getaffinity(0), settings.cpus)
    splits, advised_as = splits_for(settings, len(pool), len(jobs), paths.share)
    rows = run_shared(jobs, splits, work=paths.share, cpus=pool, repeats=settings.repeats)
    report = share_report(rows, advised=advised_as)
    # The rows and their report as one unit: both or neither (codl.outputs).
    with output_unit({"rows": Path(rows_out), "table": Path(table_out)}, mkdir=True) as unit:
        for out, df in ((rows_out, rows), (table_out, report)):
            df.to_csv(unit.path(Path(out)), index=False)
    inputs = FigureInputs(share=report, share_jobs=tuple(str(j.name) for j in jobs))
    draw_figure(FigureName.SHARE, inputs, figures)
    return report
