"""``codl makespan [--rates-only] OUT_DIR CORES SLOTS JOB...``: the makespan of a queue of jobs
sharing one node's cores, the advisor's plan (re-split at every job's start and end) against an
even split, predicted by the fitted models and simulated at measured rates (docs/advisor.md,
"Makespan"; the work is ``codl.steps.makespan``'s).

JOB is ``NAME=FIT_RESULTS:SAMPLES[:MEASURED_RESULTS...]``: a job of the workload fitted in
FIT_RESULTS (a results directory, as `codl advise` reads it) processing SAMPLES samples; its
measured rates are the best measured combined setting at each core budget of FIT_RESULTS and of
each MEASURED_RESULTS (only the runs of FIT_RESULTS' data set, by the config's specs), or with
``--rates-only`` of the MEASURED_RESULTS alone (one allocation that measured every budget, so that
no rate mixes machines). Jobs queue in the order given, SLOTS at a time. Writes, in a result
set's layout, OUT_DIR/tables/makespan.csv (per plan), segments.csv (every schedule), rates.csv
(each workload's predicted and measured rate per core count) and
OUT_DIR/figures/makespan.png|pdf, as one unit.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from codl.cli.options import MAX_CORES, bounded_int


def add_parser(sub: Any) -> None:
    m = sub.add_parser(
        "makespan",
        help="plan and simulate a queue of jobs sharing one node's cores (advised vs even split)",
        description="The makespan of a queue of jobs sharing one node's cores: the advisor's "
        "plan against an even split, predicted by the fitted models and simulated at measured "
        "rates (docs/advisor.md, 'Makespan').",
    )
    m.add_argument(
        "--rates-only",
        action="store_true",
        help="measured rates from each job's MEASURED_RESULTS alone, not also its FIT_RESULTS",
    )
    m.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="where the outputs go")
    m.add_argument("cores", type=bounded_int(1, MAX_CORES), metavar="CORES", help="node cores")
    m.add_argument(
        "slots", type=bounded_int(1, MAX_CORES), metavar="SLOTS", help="jobs at a time (GPUs)"
    )
    m.add_argument(
        "jobs",
        nargs="+",
        metavar="JOB",
        help="NAME=FIT_RESULTS:SAMPLES[:MEASURED_RESULTS...], in queue order",
    )
    m.set_defaults(func=cmd_makespan)


def cmd_makespan(args: argparse.Namespace) -> int:
    # Imported here: pandas and the model would load for every `codl run`, whose start-up is
    # part of the measured job.
    from codl.paths import MakespanFiles
    from codl.steps.makespan import QueuedJob, makespan_to

    jobs = [QueuedJob.parse(j) for j in args.jobs]
    table = makespan_to(
        MakespanFiles(args.out_dir),
        cores=args.cores,
        slots=args.slots,
        jobs=jobs,
        rates_only=args.rates_only,
    )
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0
