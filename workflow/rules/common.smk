# Every Python helper of the workflow lives here and delegates to the `codl` package: the plan
# (config -> runs), the paths (codl.paths.ResultPaths) and the per-run resources.
import json
import os
import sys
import time
import uuid
from pathlib import Path

from snakemake.exceptions import IncompleteCheckpointException
from snakemake.logging import logger
from snakemake.settings.types import DeploymentMethod

from codl.advisor.settings import advisor_settings
from codl.config import (
    analysed_blocks,
    block_budget,
    block_progress,
    block_slots,
    build_plan,
    check_config_files,
    plan_blocks,
)
from codl.figures import RUN_FIGURES, FigureName, plan_figures
from codl.paths import FIGURE_FORMATS, ResultPaths, set_name_of
from codl.plan_registry import PLAN_ENV, recorded_hash
from codl.steps.blocks import (
    block_start_after,
    block_start_record,
    block_started,
    held_line,
    invocation_line,
)
from codl.steps.workflow import (
    advisor_targets,
    gil_targets,
    pooled_targets,
    sched_event_runs,
    slow_call_twins,
    slow_calls_targets,
    calibrate_inputs,
    calibrate_options,
    CODL_PYTHON,
    codl_python,
    block_after,
    block_group,
    share_inputs,
    share_resources,
    dataset_arg,
    dataset_dir,
    dataset_input,
    measured_run,
    dataset_spec_json,
    run_resources,
)

# The result set: this config's merges, figures, report and advice in results/<name>/, named
# by the config's `name` or its file, so that one experiment never overwrites another's tables.
PATHS = ResultPaths(set_name=set_name_of(config, workflow.configfiles))
# A config named `<set>/<invocation>`: the set whose tables pool its invocations, and the
# per-run tables its other invocations left (rules/pooled.smk, `pool_invocations`).
PARENT = PATHS.parent
INVOCATION_TABLES = [str(t) for t in PATHS.sibling_runs_tables()]
# The codl checkout this file belongs to (workflow/rules/ -> the root): not workflow.basedir,
# which is the directory of the Snakefile that was run, another workflow's when this one is used
# as a module.
CHECKOUT = (
    Path(workflow.current_basedir.get_path_or_uri(secret_free=True))
    .resolve()
    .parents[1]
)
# The files Snakemake loaded, read again by codl's loader (duplicate keys, alias bombs), so the
# workflow and `codl plan` accept exactly the same files.
check_config_files(workflow.configfiles)
ADVISOR = advisor_settings(config)
# `advisor.calibrate: FIT`: the runs are FIT's probe of this machine, derived from the committed
# fit alone (deterministic), so they are planned here and the DAG stays static (rules/calibrate.smk).
if ADVISOR.calibrate:
    from codl.steps.advisor import probe_workflow_config

    config.update(probe_workflow_config(config))
# No storage tier may point into the working directory or the workflow's own checkout.
PLAN = build_plan(
    config,
    source="the workflow config",
    project_dirs=(Path.cwd(), CHECKOUT),
)
SPECS = PLAN.specs
# The run figures this plan gets: none whose data no run records (codl.figures.plan_figures).
FIGURES = plan_figures(SPECS.values())
# The `blocks` section: run id -> its block and predecessor (empty without one).
BLOCKS = plan_blocks(config, PLAN)
BLOCK_SLOTS = block_slots(BLOCKS)
# The runs of the blocks measured already: each trace looked for once.
MEASURED = frozenset(filter(measured_run(PATHS), BLOCK_SLOTS))
# The runs this invocation measures and analyses: with a `blocks` section, the blocks measured
# so far and at most `blocks.per_invocation` more (codl.config.analysed_blocks); else every run.
ANALYSED_BLOCKS = analysed_blocks(config, BLOCKS, MEASURED.__contains__)
ANALYSED = (
    [rid for b in ANALYSED_BLOCKS for rid in b.run_ids] if BLOCKS else list(SPECS)
)
# `blocks.budget`: the blocks of ANALYSED_BLOCKS not yet measured (TO_START) start one after
# another, each only if the `block_start` checkpoint (rules/runs.smk) finds the budget left,
# so which of them the analysis holds is known as they run (started_blocks); the checkpoint's
# records are this parse's own (BLOCK_START), and the deadline counts from this parse, in
# the process that runs the checkpoint (a localrule, also under Slurm).
BUDGET = block_budget(config)
TO_START = (
    tuple(b for b in ANALYSED_BLOCKS if not MEASURED.issuperset(b.run_ids))
    if BUDGET is not None
    else ()
)
BLOCK_START = uuid.uuid4().hex[:12]
DEADLINE = time.time() + (BUDGET or 0.0)
if BLOCKS:
    logger.info(
        invocation_line(
            BLOCKS,
            sum(MEASURED.issuperset(b.run_ids) for b in BLOCKS),
            sum(not MEASURED.issuperset(b.run_ids) for b in ANALYSED_BLOCKS),
            per_invocation=config["blocks"].get("per_invocation"),
            budget_s=BUDGET,
        )
    )
# The analysed runs with the kernel's scheduler record, whose launch roles' sleeps the
# `launch_sleeps` job tables (rules/gil.smk); without such runs the job is not defined.
SCHED_RUNS = sched_event_runs(SPECS, ANALYSED)
# The analysed runs with each CUDA call's scheduling evidence -> their compute twin, whose slow
# calls the `slow_calls` job attributes (rules/slow_calls.smk); without such runs it is not defined.
SLOW_CALL_TWINS = slow_call_twins(SPECS, ANALYSED)
# The block token of runs outside Slurm: one per invocation of the workflow (Slurm jobs use
# SLURM_JOB_ID), inherited by every job it starts.
os.environ.setdefault("CODL_INVOCATION", uuid.uuid4().hex[:12])
# The frozen plan's hash, recorded by every run (codl.plan_registry): set, not defaulted,
# so a stale one from the shell never wins; an environment variable, not a rule parameter,
# so that freezing a plan re-runs nothing.
os.environ[PLAN_ENV] = recorded_hash(PATHS.frozen_plan)
# Data sets of the shared-node jobs (config section `share`); empty without one.
SHARE_INPUTS = share_inputs(config, PLAN, PATHS)
SHARE_RESOURCES = share_resources(config, PLAN)
# With --use-conda every rule runs in this environment (docs/running.md, "Software
# environment"); without it, in the one that runs Snakemake. Its file installs this checkout from
# CODL_ROOT.
CONDA_ENV = "../envs/codl.yaml"
os.environ.setdefault("CODL_ROOT", str(CHECKOUT))
# Every rule's shell runs `"$CODL_PYTHON" -m codl.cli`: the interpreter that runs Snakemake, or
# the conda environment's under --use-conda; never a codl from the caller's PATH
# (codl.steps.workflow.codl_python). Set, not defaulted: a stale value from the shell must not win.
USES_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
os.environ[CODL_PYTHON] = codl_python(sys.executable, conda=USES_CONDA)


wildcard_constraints:
    run_id="[0-9a-f]{12}",
    dataset="[A-Za-z0-9][A-Za-z0-9_.-]*",
    tier="[A-Za-z0-9][A-Za-z0-9_.-]*",
    block="block[0-9]+",


def get_spec(wildcards):
    return SPECS[wildcards.run_id]


def get_spec_json(wildcards):
    return json.dumps(get_spec(wildcards).to_dict(), sort_keys=True)


def get_dataset_spec_json(wildcards):
    return dataset_spec_json(PLAN, wildcards.dataset)


def get_dataset_out_dir(wildcards):
    return str(PATHS.dataset_dir(wildcards.dataset))


def get_tier_target(wildcards):
    return str(dataset_dir(PATHS, PLAN.tiers, wildcards.dataset, wildcards.tier))


def get_dataset_input(wildcards):
    return dataset_input(PATHS, get_spec(wildcards))


def get_dataset_arg(wildcards):
    return dataset_arg(PATHS, PLAN.tiers, get_spec(wildcards))


def get_block_after(wildcards):
    return block_after(PATHS, BLOCK_SLOTS, wildcards.run_id)


def get_block_group(wildcards):
    return block_group(BLOCK_SLOTS, wildcards.run_id)


def get_block_start_record(block):
    return str(block_start_record(PATHS, BLOCK_START, block))


def get_block_start_after(wildcards):
    return block_start_after(PATHS, TO_START, wildcards.block)


def get_block_start_first(wildcards):
    return wildcards.block == TO_START[0].name


def started_blocks():
    """The blocks this invocation's analysis holds so far and the `block_start` record it
    waits for (None: decided): ANALYSED_BLOCKS, or with a budget the measured ones and, in
    block order, those the checkpoint let start. The record is returned as a plain input, not
    raised as Snakemake's flagged checkpoint target: a job whose outputs exist and that waits
    on a flagged target is not rerun (dag.update_needrun leaves it to a later pass), and the
    tables must take each new block. When the checkpoint ends Snakemake asks again, so each
    block's runs enter the DAG one block after the other."""
    if not TO_START:
        return ANALYSED_BLOCKS, None
    held = [b for b in ANALYSED_BLOCKS if b not in TO_START]
    for blk in TO_START:
        try:
            start = checkpoints.block_start.get(block=blk.name)
        except IncompleteCheckpointException:
            return held, get_block_start_record(blk.name)
        if not block_started(start.output.record):
            break
        held.append(blk)
    return sorted(held, key=lambda b: b.index), None


def log_blocks_held():
    """At the end of an invocation, how many of the planned blocks its tables hold."""
    if BLOCKS and PATHS.blocks_table.is_file():
        logger.info(held_line(PATHS.blocks_table))


def get_block_rows(wildcards):
    held, _ = started_blocks()
    return block_progress(
        BLOCKS, held, budget_spent=[b for b in TO_START if b not in held]
    )


def get_run_resource(name, missing=0):
    """A run job's resource `name`; `missing` where run_resources sets none. None leaves the
    resource undeclared: the Slurm jobstep plugin checks only that `mpi` exists, and a one-rank
    job that declared it (even as 0) would skip the plugin's `srun --cpu-bind` wrapper.
    """

    def lookup(wildcards, attempt):
        return run_resources(get_spec(wildcards), config.get("slurm", {}), attempt).get(
            name, missing
        )

    return lookup


def all_of(kind, runs=None):
    """``kind``'s file of each of ``runs``, by default every run this invocation analyses;
    with a budget an input function that keeps the runs of the blocks that started."""
    runs = ANALYSED if runs is None else runs
    # One path pattern, filled per run: building each run's paths whole took seconds of every
    # DAG build of a 1,000-run matrix (a run's paths depend on its id alone).
    pattern = str(getattr(PATHS, kind)("{run_id}"))
    if not TO_START:
        return [pattern.replace("{run_id}", run_id) for run_id in runs]

    def held_files(wildcards):
        blocks, pending = started_blocks()
        held = {rid for b in blocks for rid in b.run_ids}
        files = [pattern.replace("{run_id}", rid) for rid in runs if rid in held]
        return files + ([pending] if pending else [])

    return held_files


def get_figure_outputs():
    """The `figures` rule's outputs: the PNG of each figure of the plan by name, a report entry
    with its caption and labels, and their PDFs (`pdfs`). The specs decide which figures
    (codl.figures.plan_figures): none of API latency where no run records the calls."""
    pngs = {
        name.value: report(
            PATHS.figure(name),
            caption=f"../report/{name.value}.rst",
            category="Figures",
            subcategory=labels.subcategory,
            labels={
                "figure": name.value,
                "shows": labels.shows,
                "statistic": labels.statistic,
            },
        )
        for name, labels in RUN_FIGURES.items()
        if name in FIGURES
    }
    return pngs | {"pdfs": [str(PATHS.figure(name, "pdf")) for name in FIGURES]}


def get_final_outputs():
    figures = [str(PATHS.figure(n, fmt)) for n in FIGURES for fmt in FIGURE_FORMATS]
    tables = [
        str(PATHS.runs_table),
        str(PATHS.comparison_table),
        str(PATHS.decomposition_table),
        *([str(PATHS.blocks_table)] if BLOCKS else []),
        *(
            pooled_targets(PATHS, PARENT if INVOCATION_TABLES else None)
            if BLOCKS
            else []
        ),
        *gil_targets(PATHS, SCHED_RUNS),
        *slow_calls_targets(PATHS, SLOW_CALL_TWINS),
    ]
    return tables + figures + advisor_targets(config, PATHS)
