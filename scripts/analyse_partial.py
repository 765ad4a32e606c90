"""Summarize, compare and plot the runs of a matrix that ran only in part.

The workflow's `compare` and `figures` rules need every run of the config. An allocation of a GPU
node may end before the matrix does (results/h200x2 holds 17 of its config's 33 runs); this
runs the same package functions on the traces that exist and writes the tables and figures the
rules would have written, plus the per-call attribution of slow CUDA API calls for every run
with `trace.cuda_api_sched` against its isolation twin with the same evidence.

    python scripts/analyse_partial.py WORKDIR OUT
      WORKDIR: holds results/runs/<run_id>/{spec.json,trace.h5} (e.g. unpacked from
               `scripts/h200.sh pack`)
      OUT:     receives tables/ and figures/
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from codl.analysis import calls
from codl.paths import RunFiles
from codl.spec import Mode, RunSpec
from codl.steps.analysis import compare_to, figures_to, summarize_to


def main(root: Path, out: Path) -> None:
    runs = root / "results" / "runs"
    ids = sorted(p.name for p in runs.iterdir() if RunFiles(p).trace.is_file())
    for rid in ids:
        files = RunFiles(runs / rid)
        summarize_to(files.trace, **files.tables())
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)

    def each(name: str) -> list[Path]:
        return [getattr(RunFiles(runs / rid), name) for rid in ids]

    compare_to(
        summaries=each("summary"),
        steps=each("steps"),
        attributions=each("attribution"),
        parts=each("parts"),
        runs_table=tables / "runs.csv",
        steps_table=tables / "steps.csv.gz",
        comparison_table=tables / "comparison.csv",
        attribution_table=tables / "attribution.csv.gz",
        decomposition_table=tables / "decomposition.csv.gz",
    )
    figures_to(
        runs_table=tables / "runs.csv",
        steps_table=tables / "steps.csv.gz",
        comparison_table=tables / "comparison.csv",
        decomposition_table=tables / "decomposition.csv.gz",
        api_calls=each("api_calls"),
        timelines=each("timeline"),
        figdir=out / "figures",
    )
    specs = {
        rid: RunSpec.from_dict(json.loads(RunFiles(runs / rid).spec.read_text())) for rid in ids
    }
    by_id = {s.run_id: rid for rid, s in specs.items()}
    slow = []
    for rid, spec in specs.items():
        if not spec.trace.cuda_api_sched or spec.mode.is_isolation:
            continue
        twin_mode = Mode.COMPUTE_COMM if spec.mode.communicates else Mode.COMPUTE
        if spec.mode is twin_mode:
            continue  # the twin itself: its calls are the baseline
        twin = by_id.get(spec.with_mode(twin_mode).run_id)
        twin_path = RunFiles(runs / twin).trace if twin else None
        slow.append(calls.attribute_trace(RunFiles(runs / rid).trace, twin_path))
    if slow:
        pd.concat(slow, ignore_index=True).to_csv(tables / "slow_calls.csv.gz", index=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
