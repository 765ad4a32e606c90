"""One place owns every output filename of the workflow and the CLI.

Run outputs depend only on ``run_id``; the Snakemake rules build their patterns by passing
``"{run_id}"`` through the same methods, so a rename here moves rules, scripts and tests together.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codl.errors import ConfigError

# Every figure is written in each format; its name is codl.figures.FigureName's.
FIGURE_FORMATS = ("png", "pdf")
# Written last into a data set directory: its presence marks a complete data set.
DATASET_MANIFEST = "MANIFEST.json"


def summarize_manifest(summary: Path) -> Path:
    """The unit manifest of the summarize tables whose summary table is ``summary``:
    ``summarize.unit.json`` beside ``summary.parquet``, ``<job>.summarize.unit.json`` beside
    ``<job>.summary.parquet``."""
    name = summary.name
    prefix = name.removesuffix("summary.parquet")
    if prefix == name:  # another name: its stem, then the suffix
        prefix = f"{summary.stem}."
    return summary.with_name(f"{prefix}summarize.unit.json")


def compare_manifest(runs_table: Path) -> Path:
    """The unit manifest of the merged tables compare writes beside its runs table
    ``runs_table``: ``compare.unit.json`` beside ``runs.csv``, ``<stem>.compare.unit.json``
    beside another name."""
    name = runs_table.name
    prefix = name.removesuffix("runs.csv")
    if prefix == name:
        prefix = f"{runs_table.name.split('.')[0]}."
    return runs_table.with_name(f"{prefix}compare.unit.json")


def frozen_plan_of(set_dir: Path) -> Path:
    """The frozen plan of the result set in ``set_dir`` (``codl plan --freeze``): beside its
    tables, not among them, as it is written before any of them."""
    return set_dir / "plan.frozen.json"


@dataclass(frozen=True)
class RunFiles:
    """The file names inside one run's directory, wherever that directory is: the workflow's
    ``results/runs/<run_id>/`` (through :class:`ResultPaths`) or a directory given to the CLI."""

    dir: Path

    @property
    def spec(self) -> Path:
        return self.dir / "spec.json"

    @property
    def trace(self) -> Path:
        return self.dir / "trace.h5"

    @property
    def kineto(self) -> Path:
        return self.dir / "kineto"

    @property
    def steps(self) -> Path:
        return self.dir / "steps.parquet"

    @property
    def summary(self) -> Path:
        return self.dir / "summary.parquet"

    @property
    def attribution(self) -> Path:
        return self.dir / "attribution.parquet"

    @property
    def parts(self) -> Path:
        """Per (rank, step) decomposition inputs: launch roles' CPU time, peer wait, kernels."""
        return self.dir / "parts.parquet"

    @property
    def api_calls(self) -> Path:
        """The measured CUDA runtime API calls' latencies in per-name buckets, for the latency
        CDF (codl.figures.run_tables)."""
        return self.dir / "api_calls.parquet"

    @property
    def calls(self) -> Path:
        """Every CUDA runtime API call, a row each (``steps.analysis.write_calls``): written
        only where asked (``codl summarize --calls``, the workflow's ``calls`` rule)."""
        return self.dir / "calls.parquet"

    @property
    def timeline(self) -> Path:
        """The run's representative step as step-timeline bars (codl.figures.run_tables)."""
        return self.dir / "timeline.parquet"

    @property
    def summarize_unit(self) -> Path:
        """The manifest of the tables summarize wrote as one unit (codl.outputs)."""
        return summarize_manifest(self.summary)

    def tables(self) -> dict[str, Path]:
        """Every table summarize writes for one run, by the keyword summarize_to takes."""
        return {
            "steps": self.steps,
            "summary": self.summary,
            "attribution": self.attribution,
            "parts": self.parts,
            "api_calls": self.api_calls,
            "timeline": self.timeline,
        }


@dataclass(frozen=True)
class ShareFiles:
    """The files of one shared-node experiment (``codl.steps.share``) under its directory: per
    split and repeat a directory of the jobs' traces, each trace's summarize tables beside it."""

    dir: Path

    @property
    def advised_splits(self) -> Path:
        """Every split ``advise_split`` scored for ``share.advise_from``."""
        return self.dir / "advised_splits.csv"

    def trace(self, job: str, split: str | None = None, repeat: int = 0) -> Path:
        """Job ``job``'s trace in ``split``'s ``repeat`` (at the top without a split)."""
        where = self.dir if split is None else self.dir / split / str(repeat)
        return where / f"{job}.h5"

    @staticmethod
    def job_tables(trace: Path) -> dict[str, Path]:
        """The summarize tables of one job's trace, beside it, by summarize_to's keywords."""
        kinds = ("steps", "summary", "attribution", "parts")
        return {k: trace.with_name(f"{trace.stem}.{k}.parquet") for k in kinds}


# A result set's name: a directory name under results/, never the runs' own directory.
@dataclass(frozen=True)
class MakespanFiles:
    """What ``codl makespan OUT_DIR ...`` writes into OUT_DIR (docs/advisor.md, "Makespan"):
    a result set's layout, tables under ``tables/`` and the figure under ``figures/``."""

    dir: Path

    @property
    def table(self) -> Path:
        """Per plan: its predicted and simulated makespan."""
        return self.dir / "tables" / "makespan.csv"

    @property
    def segments(self) -> Path:
        """Every simulated schedule: cores per job over time."""
        return self.dir / "tables" / "segments.csv"

    @property
    def rates(self) -> Path:
        """Per workload and core count: its predicted and measured rate."""
        return self.dir / "tables" / "rates.csv"

    def figure(self, fmt: str = "png") -> Path:
        return self.dir / "figures" / f"makespan.{fmt}"


_NAME_PART = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
#: A result set's name: ``set``, or ``set/invocation`` for one invocation of a set measured over
#: several (nodes, allocations, days), whose parent pools them (docs/outputs.md).
SET_NAME = re.compile(rf"{_NAME_PART}(?:/{_NAME_PART})?")
RESERVED_SET_NAMES = frozenset({"runs"})
#: A set's own folders, which no invocation of it may be named.
_SET_PARTS = frozenset({"tables", "figures", "advice"})


def check_set_name(name: str, *, key: str = "name") -> str:
    """``name`` if it can name a result set (a directory under ``results/``), else a
    ConfigError naming ``key``."""
    if not isinstance(name, str) or not SET_NAME.fullmatch(name):
        raise ConfigError(
            [
                f"{key}: {name!r} cannot name a result set: expected 1-64 letters, digits, '_', "
                "'.' or '-', starting with a letter or digit, or two such names as "
                "<set>/<invocation>"
            ]
        )
    top, _, sub = name.partition("/")
    if sub in _SET_PARTS:
        raise ConfigError(
            [f"{key}: {name!r}: no invocation can be named {sub!r}, a folder of every result set"]
        )
    if top in RESERVED_SET_NAMES:
        raise ConfigError(
            [f"{key}: {name!r} names the runs' directory under results/; pick another"]
        )
    return name


def set_name_of(
    cfg: Mapping[str, Any], configfiles: Sequence[str | Path], results: Path = Path("results")
) -> str:
    """The result set a config writes: its ``name`` key, else the stem of the last config file
    (``--configfile config/smoke.yaml`` -> ``smoke``), so that one experiment's tables, figures
    and report never replace another's. A config inside a result set of ``results`` (one the
    advisor wrote there) names ``<set>-<stem>``: ``results/loop-cpu/advice/verify.yaml`` ->
    ``loop-cpu-verify``, so that two sets' verification runs never share tables."""
    if cfg.get("name") is not None:
        return check_set_name(cfg["name"])
    if not configfiles:
        raise ConfigError(["name: no config file and no `name` key: cannot name the result set"])
    last = Path(configfiles[-1])
    stem = last.stem
    try:
        inside = last.resolve().relative_to(results.resolve()).parts
    except ValueError:
        inside = ()
    if len(inside) > 1 and inside[0] not in RESERVED_SET_NAMES:
        stem = f"{inside[0]}-{stem}"
    return check_set_name(stem, key=f"name (from the file name {str(last)!r})")


@dataclass(frozen=True)
class ResultPaths:
    """Every output path of the workflow. Runs live under ``results/runs/<run_id>/``, shared by
    every config that plans them (a run's path depends only on its spec); what one config
    merges and draws (tables, figures, report, advice, shared-node jobs) lives in its result
    set, ``results/<set_name>/``. Without a set name the merged outputs sit in ``results/``
    itself, as a directory given to ``codl advise RESULTS`` is read."""

    root: Path = Path()
    set_name: str | None = None

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def set_dir(self) -> Path:
        """The result set's directory: what this config's merges, figures and report fill."""
        return self.results / self.set_name if self.set_name is not None else self.results

    @property
    def parent(self) -> ResultPaths | None:
        """The set whose invocation this one is (``nice-h200/b`` -> ``nice-h200``): its tables
        pool every invocation's (the ``pool_invocations`` rule); None for a set of its own."""
        if self.set_name is None or "/" not in self.set_name:
            return None
        return ResultPaths(root=self.root, set_name=self.set_name.split("/")[0])

    def sibling_runs_tables(self) -> list[Path]:
        """The per-run tables of the parent's other invocations, one per invocation: its
        ``pooled_runs.csv`` (the ``pooled`` rule's), else its ``gil_runs.csv`` (sets tabled
        before that rule); none without a parent."""
        parent = self.parent
        if parent is None:
            return []
        out = []
        for sub in (
            sorted(p for p in parent.set_dir.iterdir() if p.is_dir())
            if parent.set_dir.is_dir()
            else []
        ):
            other = ResultPaths(root=self.root, set_name=f"{parent.set_name}/{sub.name}")
            if sub.name in _SET_PARTS or other.set_dir == self.set_dir:
                continue
            table = next(
                (t for t in (other.pooled_runs_table, other.gil_runs_table) if t.is_file()), None
            )
            if table is not None:
                out.append(table)
        return out

    @property
    def resources(self) -> Path:
        return self.root / "resources"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    # data sets
    def dataset_dir(self, name: str) -> Path:
        return self.resources / "datasets" / name

    def dataset_manifest(self, name: str) -> Path:
        return self.dataset_dir(name) / DATASET_MANIFEST

    def staged_marker(self, tier: str, name: str) -> Path:
        """Proof that data set ``name`` was copied to storage tier ``tier``."""
        return self.resources / "staged" / tier / f"{name}.json"

    # one run
    def run_dir(self, run_id: str) -> Path:
        return self.results / "runs" / run_id

    def run_files(self, run_id: str) -> RunFiles:
        return RunFiles(self.run_dir(run_id))

    def spec(self, run_id: str) -> Path:
        return self.run_files(run_id).spec

    def trace(self, run_id: str) -> Path:
        return self.run_files(run_id).trace

    def kineto_dir(self, run_id: str) -> Path:
        return self.run_files(run_id).kineto

    def summary(self, run_id: str) -> Path:
        return self.run_files(run_id).summary

    def steps(self, run_id: str) -> Path:
        return self.run_files(run_id).steps

    def attribution(self, run_id: str) -> Path:
        return self.run_files(run_id).attribution

    def parts(self, run_id: str) -> Path:
        return self.run_files(run_id).parts

    def api_calls(self, run_id: str) -> Path:
        return self.run_files(run_id).api_calls

    def timeline(self, run_id: str) -> Path:
        return self.run_files(run_id).timeline

    def calls(self, run_id: str) -> Path:
        return self.run_files(run_id).calls

    def log(self, rule: str, name: str | None = None) -> Path:
        """The log of one job of ``rule``: ``logs/<rule>/<name>.log`` for a job per wildcard
        value (pass ``"{run_id}"`` for a rule's pattern), ``logs/<rule>.log`` for a single job."""
        return self.logs / rule / f"{name}.log" if name is not None else self.logs / f"{rule}.log"

    def run_log(self, run_id: str) -> Path:
        return self.log("run", run_id)

    def summarize_log(self, run_id: str) -> Path:
        return self.log("summarize", run_id)

    def calls_log(self, run_id: str) -> Path:
        return self.log("calls", run_id)

    # merges
    @property
    def tables(self) -> Path:
        return self.set_dir / "tables"

    @property
    def runs_table(self) -> Path:
        return self.tables / "runs.csv"

    @property
    def steps_table(self) -> Path:
        return self.tables / "steps.csv.gz"

    @staticmethod
    def merged_tables_of(results: Path) -> tuple[Path, Path]:
        """The runs and steps tables of another results directory laid out as the workflow
        writes it (``codl advise RESULTS``, ``share.advise_from``)."""
        std = ResultPaths()
        return (
            results / std.runs_table.relative_to(std.set_dir),
            results / std.steps_table.relative_to(std.set_dir),
        )

    @property
    def comparison_table(self) -> Path:
        return self.tables / "comparison.csv"

    @property
    def compare_unit(self) -> Path:
        """The manifest of the five tables compare writes as one unit (codl.outputs)."""
        return compare_manifest(self.runs_table)

    @property
    def attribution_table(self) -> Path:
        return self.tables / "attribution.csv"

    @property
    def blocks_table(self) -> Path:
        """The planned blocks, and which of them the set's tables hold (``blocks`` section)."""
        return self.tables / "blocks.csv"

    @property
    def decomposition_table(self) -> Path:
        return self.tables / "decomposition.csv"

    # a block experiment pooled over its blocks (the `pooled` rule, codl.steps.pooled)
    @property
    def pooled_runs_table(self) -> Path:
        """One row per run: its factors, compute, throughput and launch roles' sleeps."""
        return self.tables / "pooled_runs.csv"

    @property
    def pooled_inflation_table(self) -> Path:
        """Per loading setting: the compute inflation over blocks (each run beside its twin)."""
        return self.tables / "pooled_inflation.csv"

    @property
    def pooled_throughput_table(self) -> Path:
        """Per ring setting: its throughput over the best torch setting of the same block."""
        return self.tables / "pooled_throughput.csv"

    @property
    def pooled_efficiency_table(self) -> Path:
        """Per loading setting: throughput over the roofline of its block (min of data alone
        and compute alone), over blocks, and the lost time's parts (codl.analysis.efficiency)."""
        return self.tables / "pooled_efficiency.csv"

    def efficiency_figure(self, fmt: str = "png") -> Path:
        """Efficiency per setting with a point per block, and the lost time's parts stacked."""
        return self.figure("efficiency", fmt)

    @property
    def pooled_levels_table(self) -> Path:
        """Per loading setting, pooled over invocations with the invocation as a level: blocks,
        invocation means and random effects side by side (codl.analysis.levels)."""
        return self.tables / "pooled_levels.csv"

    # the plan fixed before its runs (codl.plan_registry, docs/preregistration.md)
    @property
    def frozen_plan(self) -> Path:
        return frozen_plan_of(self.set_dir)

    # the launch roles' sleeps of runs with the scheduler record (the `launch_sleeps` rule,
    # codl.steps.gil)
    @property
    def gil_runs_table(self) -> Path:
        """One row per run: its factors, block, compute, throughput, launch roles' sleeps."""
        return self.tables / "gil_runs.csv"

    @property
    def slow_calls_table(self) -> Path:
        """One row per slow CUDA API call, attributed against the run's compute twin."""
        return self.tables / "slow_calls.csv.gz"

    def intervention_figure(self, fmt: str = "png") -> Path:
        """Inflation per setting with a point per block, and the host-blocked part."""
        return self.figure("intervention", fmt)

    @property
    def figures(self) -> Path:
        return self.set_dir / "figures"

    def figure(self, name: str, fmt: str = "png") -> Path:
        return self.figures / f"{name}.{fmt}"

    @property
    def report(self) -> Path:
        return self.set_dir / "report.html"

    # the loader advisor (docs/advisor.md)
    @property
    def map_table(self) -> Path:
        return self.tables / "interference_map.csv"

    @property
    def advice(self) -> Path:
        return self.set_dir / "advice"

    @property
    def advice_text(self) -> Path:
        return self.advice / "advice.txt"

    @property
    def verify_config(self) -> Path:
        return self.advice / "verify.yaml"

    @property
    def predictions_table(self) -> Path:
        return self.advice / "predictions.csv"

    @property
    def probe_config(self) -> Path:
        """The calibration probe's config (``advisor.calibrate``)."""
        return self.advice / "probe.yaml"

    @property
    def calibration_table(self) -> Path:
        """Per probe configuration: measured, predicted before and after the calibration."""
        return self.advice / "calibration.csv"

    @property
    def uncalibrated_predictions_table(self) -> Path:
        """The uncalibrated fit's predictions of the calibrated predictions' settings: the
        blind check scores both (``codl check blind``)."""
        return self.advice / "predictions_uncalibrated.csv"

    @property
    def uncalibrated_record(self) -> Path:
        """The sha256 and time of ``uncalibrated_predictions_table``, written before any
        verification run (as ``verify.yaml`` records the calibrated predictions')."""
        return self.advice / "predictions_uncalibrated.json"

    @property
    def blind_table(self) -> Path:
        """A calibrated advice's verification: both predictions against its runs, per setting."""
        return self.tables / "blind_error.csv"

    @property
    def blind_summary(self) -> Path:
        return self.tables / "blind_error_summary.csv"

    @staticmethod
    def calibrated_set_of(predictions: Path | str) -> Path | None:
        """The result set whose ``calibrate`` rule wrote ``predictions`` (a verification
        config's ``advisor.predictions``), or None when those predictions are not a
        calibration's (no uncalibrated record beside them): the sets of a blind check."""
        std = ResultPaths()
        set_dir = Path(predictions)
        for _ in std.predictions_table.relative_to(std.set_dir).parts:
            set_dir = set_dir.parent
        record = set_dir / std.uncalibrated_record.relative_to(std.set_dir)
        return set_dir if record.is_file() else None

    @property
    def predicted_vs_measured_table(self) -> Path:
        return self.tables / "predicted_vs_measured.csv"

    @property
    def share(self) -> Path:
        return self.set_dir / "share"

    @property
    def share_files(self) -> ShareFiles:
        return ShareFiles(self.share)

    @property
    def share_rows(self) -> Path:
        return self.share / "rows.csv"

    @property
    def share_table(self) -> Path:
        return self.tables / "share.csv"
