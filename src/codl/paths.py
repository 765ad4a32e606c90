"""One place owns every output filename of the workflow and the CLI.

Run outputs depend only on ``run_id``; the Snakemake rules build their patterns by passing
``"{run_id}"`` through the same methods, so a rename here moves rules, scripts and tests together.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FIGURES = (
    "component_durations",
    "api_latency_cdf",
    "launch_wait_vs_compute",
    "step_timeline",
    "policy_heatmap",
    "step_time_distributions",
)
# The decomposition figure is drawn from the decomposition table (the others from runs, steps,
# comparison and traces); every figure has its own report entry and caption (analysis.smk).
DECOMPOSITION_FIGURE = "decomposition"
ALL_FIGURES = (*FIGURES, DECOMPOSITION_FIGURE)
FIGURE_FORMATS = ("png", "pdf")
# The advisor's figures, drawn only when the config's `advisor` section asks for them.
MAP_FIGURE = "interference_map"
PREDICTION_FIGURE = "predicted_vs_measured"
SHARE_FIGURE = "share"


@dataclass(frozen=True)
class ResultPaths:
    root: Path = Path()

    @property
    def results(self) -> Path:
        return self.root / "results"

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
        return self.dataset_dir(name) / "MANIFEST.json"

    def staged_marker(self, tier: str, name: str) -> Path:
        """Proof that data set ``name`` was copied to storage tier ``tier``."""
        return self.resources / "staged" / tier / f"{name}.json"

    # one run
    def run_dir(self, run_id: str) -> Path:
        return self.results / "runs" / run_id

    def spec(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "spec.json"

    def trace(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "trace.h5"

    def kineto_dir(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "kineto"

    def summary(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "summary.parquet"

    def steps(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "steps.parquet"

    def attribution(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "attribution.parquet"

    def parts(self, run_id: str) -> Path:
        """Per (rank, step) decomposition inputs: launch roles' CPU time, peer wait, kernels."""
        return self.run_dir(run_id) / "parts.parquet"

    def run_log(self, run_id: str) -> Path:
        return self.logs / "run" / f"{run_id}.log"

    def summarize_log(self, run_id: str) -> Path:
        return self.logs / "summarize" / f"{run_id}.log"

    # merges
    @property
    def tables(self) -> Path:
        return self.results / "tables"

    @property
    def runs_table(self) -> Path:
        return self.tables / "runs.csv"

    @property
    def steps_table(self) -> Path:
        return self.tables / "steps.csv.gz"

    @property
    def comparison_table(self) -> Path:
        return self.tables / "comparison.csv"

    @property
    def attribution_table(self) -> Path:
        return self.tables / "attribution.csv"

    @property
    def decomposition_table(self) -> Path:
        return self.tables / "decomposition.csv"

    @property
    def figures(self) -> Path:
        return self.results / "figures"

    def figure(self, name: str, fmt: str = "png") -> Path:
        return self.figures / f"{name}.{fmt}"

    @property
    def report(self) -> Path:
        return self.results / "report.html"

    # the loader advisor (docs/advisor.md)
    @property
    def map_table(self) -> Path:
        return self.tables / "interference_map.csv"

    @property
    def advice(self) -> Path:
        return self.results / "advice"

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
    def predicted_vs_measured_table(self) -> Path:
        return self.tables / "predicted_vs_measured.csv"

    @property
    def share(self) -> Path:
        return self.results / "share"

    @property
    def share_rows(self) -> Path:
        return self.share / "rows.csv"

    @property
    def share_table(self) -> Path:
        return self.tables / "share.csv"
