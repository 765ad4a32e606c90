"""Makespan of a queue of jobs sharing one node's cores: the advisor's plan (re-split at every
job's start and end) against an even split, predicted by the fitted models and simulated at
measured rates (docs/advisor.md, "Makespan").

    python scripts/makespan.py [--rates-only] OUT_DIR CORES SLOTS JOB...

JOB is ``NAME=FIT_RESULTS:SAMPLES[:MEASURED_RESULTS...]``: a job of the workload fitted in
FIT_RESULTS (a results directory, as `codl advise` reads it) processing SAMPLES samples; its
measured rates are the best measured combined setting at each core budget of FIT_RESULTS and
of each MEASURED_RESULTS (only the runs of FIT_RESULTS' data set, by the config's specs), or
with ``--rates-only`` of the MEASURED_RESULTS alone (e.g. one allocation that measured every budget,
so that no rate mixes machines). Jobs queue in the order given, SLOTS at a time. Writes
OUT_DIR/makespan.csv (per plan), OUT_DIR/segments.csv (every schedule), OUT_DIR/rates.csv (each
workload's predicted and measured rate per core count) and OUT_DIR/makespan.png|pdf, as one
unit.

Made results/makespan-h200/ (every allocation's runs), results/makespan-h200/one-alloc/ and
one-alloc-b/ (the rates of results/makespan-h200/alloc, resp. alloc-b, alone: every budget the
plans use measured in one call):
    python scripts/makespan.py results/makespan-h200 16 2 \\
        light1=results/fit-h200-light:1281167:results/fit-h200-check:results/makespan-h200/budgets:results/makespan-h200/alloc:results/makespan-h200/alloc-b \\
        heavy1=results/fit-h200-heavy:427056:results/fit-h200-check:results/makespan-h200/heavy10:results/makespan-h200/budgets:results/makespan-h200/alloc:results/makespan-h200/alloc-b \\
        light2=results/fit-h200-light:1281167:results/fit-h200-check:results/makespan-h200/budgets:results/makespan-h200/alloc:results/makespan-h200/alloc-b \\
        heavy2=results/fit-h200-heavy:427056:results/fit-h200-check:results/makespan-h200/heavy10:results/makespan-h200/budgets:results/makespan-h200/alloc:results/makespan-h200/alloc-b
    python scripts/makespan.py --rates-only results/makespan-h200/one-alloc 16 2 \\
        light1=results/fit-h200-light:1281167:results/makespan-h200/alloc \\
        heavy1=results/fit-h200-heavy:427056:results/makespan-h200/alloc \\
        light2=results/fit-h200-light:1281167:results/makespan-h200/alloc \\
        heavy2=results/fit-h200-heavy:427056:results/makespan-h200/alloc
    python scripts/makespan.py --rates-only results/makespan-h200/one-alloc-b 16 2 \\
        light1=results/fit-h200-light:1281167:results/makespan-h200/alloc-b \\
        heavy1=results/fit-h200-heavy:427056:results/makespan-h200/alloc-b \\
        light2=results/fit-h200-light:1281167:results/makespan-h200/alloc-b \\
        heavy2=results/fit-h200-heavy:427056:results/makespan-h200/alloc-b
"""  # noqa: E501 (the commands that made the committed outputs, whole: a test reruns them)

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pandas as pd

from codl.advisor import advise as adv
from codl.advisor import makespan as ms
from codl.advisor import model as mdl
from codl.config import build_plan, load_yaml
from codl.errors import CodlError
from codl.figures.makespan import draw_makespan
from codl.outputs import output_unit
from codl.paths import ResultPaths
from codl.steps.advisor import fit_results


def dataset_of(results: Path) -> str:
    return str(load_yaml(results / "config.yaml")["defaults"]["dataset"]["name"])


def runs_of(results: Path, dataset: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """RESULTS' runs of ``dataset`` (by its config's specs) and their steps."""
    runs_csv, steps_csv = ResultPaths.merged_tables_of(results)
    runs, steps = pd.read_csv(runs_csv), pd.read_csv(steps_csv)
    specs = build_plan(load_yaml(results / "config.yaml")).specs
    keep = runs["run_id"].map(lambda r: r in specs and specs[r].dataset.name == dataset)
    runs = runs[keep]
    return runs, steps[steps["run_id"].isin(runs["run_id"])]


def main(argv: list[str]) -> int:
    rates_only = bool(argv) and argv[0] == "--rates-only"
    if rates_only:
        argv = argv[1:]
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    out, cores, slots = Path(argv[0]), int(argv[1]), int(argv[2])
    jobs: list[ms.Job] = []
    predicted: dict[str, ms.Rate] = {}
    measured: dict[str, ms.Rate] = {}
    budgets: dict[str, list[int]] = {}
    rate_rows: list[pd.DataFrame] = []
    for spec in argv[3:]:
        name, _, rest = spec.partition("=")
        fit_dir, samples, *more = rest.split(":")
        workload = Path(fit_dir).name
        jobs.append(ms.Job(name=name, workload=workload, samples=float(samples)))
        if workload in predicted:
            continue
        fitted = fit_results(Path(fit_dir), boot=0)
        fit = fitted.fit

        @functools.cache
        def rate(c: int, fit: mdl.Fit = fit) -> float:
            try:
                return adv.advise(fit, cores=c).throughput
            except mdl.ModelError:
                return 0.0  # no core left to the loader

        predicted[workload] = rate
        dataset = dataset_of(Path(fit_dir))
        if rates_only and not more:
            raise CodlError(f"makespan: --rates-only: job {name!r} names no MEASURED_RESULTS")
        tables = [runs_of(Path(d), dataset) for d in (more if rates_only else (fit_dir, *more))]
        data = mdl.run_data(
            pd.concat([t[0] for t in tables], ignore_index=True),
            pd.concat([t[1] for t in tables], ignore_index=True),
        )
        best = ms.measured_rates(data)
        measured[workload] = ms.interpolated(best)
        budgets[workload] = [int(c) for c in best["cores"]]
        grid = pd.DataFrame({"cores": range(1, cores + 1)})
        grid["predicted"] = [rate(int(c)) for c in grid["cores"]]
        grid["measured"] = [measured[workload](int(c)) for c in grid["cores"]]
        grid["measured_budget"] = grid["cores"].isin(budgets[workload])
        grid = grid.merge(
            best.rename(columns={"throughput": "measured_best", "runs": "measured_runs"}),
            on="cores",
            how="left",
        )
        rate_rows.append(grid.assign(workload=workload))
    table, segments = ms.plan_table(
        jobs,
        cores=cores,
        slots=slots,
        predicted=predicted,
        measured=measured,
        measured_budgets=budgets,
    )
    names = ("makespan.csv", "segments.csv", "rates.csv", "makespan.png", "makespan.pdf")
    with output_unit([out / n for n in names], mkdir=True) as unit:
        table.to_csv(unit.path(out / names[0]), index=False, float_format="%.4g")
        segments.to_csv(unit.path(out / names[1]), index=False, float_format="%.6g")
        pd.concat(rate_rows).to_csv(unit.path(out / names[2]), index=False, float_format="%.1f")
        draw_makespan(table, segments, [unit.path(out / n) for n in names[3:]])
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except CodlError as exc:
        print(f"makespan: error: {exc}", file=sys.stderr)
        sys.exit(2)
