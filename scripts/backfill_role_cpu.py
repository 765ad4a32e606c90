"""Add the launch helpers' on-CPU time per step to a steps table summarized before it had them.

    python scripts/backfill_role_cpu.py RESULTS_DIR [RESULTS_DIR ...]

``summarize`` now writes ``autograd_run_ms``, ``pin_memory_run_ms`` and ``comm_run_ms`` per
(rank, step) beside ``launch_run_ms`` (``summarize.helper_metrics``); the throughput model
charges their sum against the loader's cores (docs/advisor.md, "Equations"). Tables written
before that have the same scheduler deltas in ``attribution.csv.gz``: every other thread's
on-CPU time in each step, weighted by the share of its CPU mask inside the launch thread's.
Under policy ``none`` every thread's mask is the run's whole set, so the weight is 1 and the
attribution's ``share_ns`` *is* the thread's on-CPU time. This script sums it per role for the
``none`` runs and leaves the other runs' columns empty (a pinned helper's weight is not 1).

A helper without rows in a ``none`` run did not run (a CPU run has no pin-memory thread, a
one-rank run no comm thread): 0, as summarize writes. The script prints each run's means, and
names a CUDA loading run whose pin-memory thread shows no time (its threads were not recorded,
so its row would understate the roles). The traces are not needed; the tables are rewritten in
place.
Used once for results/fit-h200-{light,heavy,check} (their traces stayed on the GPU machine).
A maintenance tool, not an experiment: a migration of committed tables, kept because others
(results/h200, h200x2, loop-h200*, map-h200) still lack the columns and have no traces here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from codl.analysis.columns import HELPER_ROLES

KEYS = ["run_id", "rank", "step"]


def helper_times(runs: pd.DataFrame, attribution: pd.DataFrame) -> pd.DataFrame:
    """Per (run_id, rank, step) of the ``none`` runs whose helpers were recorded: each helper
    role's on-CPU ms (``<role>_run_ms``), 0 for a role that did not run in that step."""
    none = set(runs.loc[runs["policy"].astype(str) == "none", "run_id"].astype(str))
    a = attribution[
        attribution["run_id"].astype(str).isin(none)
        & (attribution["rank"] == attribution["thread_rank"])
        & attribution["role"].isin(HELPER_ROLES)
    ]
    if a.empty:
        return pd.DataFrame(columns=[*KEYS, *(f"{r}_run_ms" for r in HELPER_ROLES)])
    per = a.groupby([*KEYS, "role"])["share_ns"].sum().unstack("role", fill_value=0) / 1e6
    out = pd.DataFrame(index=per.index)
    for role in HELPER_ROLES:
        out[f"{role}_run_ms"] = per.get(role, 0.0)
    return out.reset_index()


def backfill(results: Path) -> pd.DataFrame:
    tables = results / "tables"
    runs = pd.read_csv(tables / "runs.csv")
    steps = pd.read_csv(tables / "steps.csv.gz")
    columns = [f"{r}_run_ms" for r in HELPER_ROLES]
    present = [c for c in columns if c in steps]
    if present:
        raise SystemExit(f"{tables / 'steps.csv.gz'}: already has {present}")
    times = helper_times(runs, pd.read_csv(tables / "attribution.csv.gz"))
    none = set(runs.loc[runs["policy"].astype(str) == "none", "run_id"].astype(str))
    merged = steps.merge(times, on=KEYS, how="left")
    # Steps of a `none` run without a helper row: no helper ran then.
    fill = merged["run_id"].astype(str).isin(none) & merged["launch_run_ms"].notna()
    merged.loc[fill, columns] = merged.loc[fill, columns].fillna(0.0)
    merged.to_csv(tables / "steps.csv.gz", index=False)
    means = merged.groupby("run_id")[["launch_run_ms", *columns]].mean()
    loading = runs[
        (runs["device"].astype(str) == "cuda")
        & (runs["workers"] > 0)
        & runs["pin_memory"].fillna(False).astype(bool)
        & runs["run_id"].astype(str).isin(none)
    ]
    silent = sorted(set(loading["run_id"]) & set(means.index[means["pin_memory_run_ms"] == 0]))
    if silent:
        print(f"warning: no pin-memory time recorded in {silent}", file=sys.stderr)
    return means


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for arg in argv:
        print(arg)
        print(backfill(Path(arg)).round(2).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
