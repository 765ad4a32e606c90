"""What ``codl makespan`` does (docs/advisor.md, "Makespan"): a queue of jobs sharing one node's
cores, each job's rates read from results directories (predicted: the model fitted on one;
measured: the best measured combined setting at each core budget of several), planned and
simulated by ``codl.advisor.makespan``, drawn by ``codl.figures.makespan``, written as one unit
(``codl.paths.MakespanFiles``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from codl.advisor import advise as adv
from codl.advisor import makespan as ms
from codl.advisor import model as mdl
from codl.config import build_plan, load_yaml
from codl.errors import CodlError
from codl.figures.makespan import draw_makespan
from codl.outputs import output_unit
from codl.paths import FIGURE_FORMATS, MakespanFiles, ResultPaths
from codl.steps.advisor import CONFIG_NAME, fit_results

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueuedJob:
    """``NAME=FIT_RESULTS:SAMPLES[:MEASURED_RESULTS...]``: a job of the workload fitted in
    ``fit`` processing ``samples`` samples, its measured rates also read from ``measured``."""

    name: str
    fit: Path
    samples: float
    measured: tuple[Path, ...] = ()

    @property
    def workload(self) -> str:
        return self.fit.name

    @classmethod
    def parse(cls, text: str) -> QueuedJob:
        name, eq, rest = text.partition("=")
        fit, _, tail = rest.partition(":")
        samples, *more = tail.split(":") if tail else [""]
        if not eq or not name or not fit or not samples:
            raise CodlError(
                f"job {text!r}: expected NAME=FIT_RESULTS:SAMPLES[:MEASURED_RESULTS...]"
            )
        try:
            count = float(samples)
        except ValueError:
            count = float("nan")
        if not count > 0 or count == float("inf"):
            raise CodlError(f"job {text!r}: SAMPLES {samples!r} is not a positive number")
        return cls(name=name, fit=Path(fit), samples=count, measured=tuple(Path(m) for m in more))


def _dataset_of(results: Path) -> str:
    cfg = load_yaml(results / CONFIG_NAME)
    try:
        return str(cfg["defaults"]["dataset"]["name"])
    except (KeyError, TypeError) as exc:
        raise CodlError(f"{results / CONFIG_NAME}: no defaults.dataset.name") from exc


def _runs_of(results: Path, dataset: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """RESULTS' runs of ``dataset`` (by its config's specs) and their steps."""
    runs_csv, steps_csv = ResultPaths.merged_tables_of(results)
    runs, steps = pd.read_csv(runs_csv), pd.read_csv(steps_csv)
    specs = build_plan(load_yaml(results / CONFIG_NAME), source=str(results / CONFIG_NAME)).specs
    runs = runs[runs["run_id"].map(lambda r: r in specs and specs[r].dataset.name == dataset)]
    return runs, steps[steps["run_id"].isin(runs["run_id"])]


@dataclass(frozen=True)
class _Rates:
    predicted: ms.Rate
    measured: ms.Rate
    budgets: list[int]
    table: pd.DataFrame  # per core count 1..cores: predicted and measured


def _rates(job: QueuedJob, *, cores: int, rates_only: bool) -> _Rates:
    fit = fit_results(job.fit, boot=0).fit

    @functools.cache
    def predicted(c: int) -> float:
        try:
            return adv.advise(fit, cores=c).throughput
        except mdl.ModelError:
            return 0.0  # no core left to the loader

    if rates_only and not job.measured:
        raise CodlError(f"--rates-only: job {job.name!r} names no MEASURED_RESULTS")
    dataset = _dataset_of(job.fit)
    dirs = job.measured if rates_only else (job.fit, *job.measured)
    tables = [_runs_of(d, dataset) for d in dirs]
    data = mdl.run_data(
        pd.concat([t[0] for t in tables], ignore_index=True),
        pd.concat([t[1] for t in tables], ignore_index=True),
    )
    best = ms.measured_rates(data)
    measured = ms.interpolated(best)
    budgets = [int(c) for c in best["cores"]]
    grid = pd.DataFrame({"cores": range(1, cores + 1)})
    grid["predicted"] = [predicted(int(c)) for c in grid["cores"]]
    grid["measured"] = [measured(int(c)) for c in grid["cores"]]
    grid["measured_budget"] = grid["cores"].isin(budgets)
    grid = grid.merge(
        best.rename(columns={"throughput": "measured_best", "runs": "measured_runs"}),
        on="cores",
        how="left",
    )
    return _Rates(predicted, measured, budgets, grid.assign(workload=job.workload))


def makespan_to(
    out: MakespanFiles,
    *,
    cores: int,
    slots: int,
    jobs: Sequence[QueuedJob],
    rates_only: bool = False,
) -> pd.DataFrame:
    """Plan and simulate the queue ``jobs`` (in queue order, ``slots`` at a time, on ``cores``
    cores); write the makespan per plan, the schedules, the rates and the figure as one unit;
    return the makespan table. ``rates_only``: the measured rates from each job's
    MEASURED_RESULTS alone (one allocation, so that no rate mixes machines)."""
    if not jobs:
        raise CodlError("no JOB: expected NAME=FIT_RESULTS:SAMPLES[:MEASURED_RESULTS...]")
    rates: dict[str, _Rates] = {}
    for job in jobs:
        if job.workload not in rates:
            rates[job.workload] = _rates(job, cores=cores, rates_only=rates_only)
    table, segments = ms.plan_table(
        [ms.Job(name=j.name, workload=j.workload, samples=j.samples) for j in jobs],
        cores=cores,
        slots=slots,
        predicted={w: r.predicted for w, r in rates.items()},
        measured={w: r.measured for w, r in rates.items()},
        measured_budgets={w: r.budgets for w, r in rates.items()},
    )
    figures = [out.figure(fmt) for fmt in FIGURE_FORMATS]
    inputs = [p for j in jobs for p in ResultPaths.merged_tables_of(j.fit)]
    with output_unit(
        [out.table, out.segments, out.rates, *figures], inputs=inputs, mkdir=True
    ) as unit:
        # The precision of the committed tables (results/makespan-h200/), which a test
        # regenerates: more digits would only carry the simulation's rounding.
        table.to_csv(unit.path(out.table), index=False, float_format="%.4g")
        segments.to_csv(unit.path(out.segments), index=False, float_format="%.6g")
        pd.concat([r.table for r in rates.values()]).to_csv(
            unit.path(out.rates), index=False, float_format="%.1f"
        )
        draw_makespan(table, segments, [unit.path(f) for f in figures])
    log.info("wrote %s, %s, %s and the figure", out.table, out.segments, out.rates)
    return table
