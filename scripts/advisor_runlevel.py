"""The advisor's verification headlines at run level (issue 30): per setting the mean throughput
of its runs with a Student-t interval over blocks, and the advice against the other settings as
a ratio with a t interval on the logs of per-block ratios (blocks holding both; Welch on the
logs of the runs where none does), each with n_runs and n_blocks.

    python scripts/advisor_runlevel.py results/loop-h200/verify ADVICE_WORKERS
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

from codl.analysis.runlevel import (
    log_ratio_interval,
    mean_interval,
    runs_blocks,
    welch_interval,
)


def settings(runs: pd.DataFrame) -> dict[str, list[tuple[str, float]]]:
    """'policy/workers' -> (block, throughput) of each data+compute run."""
    blocks = runs_blocks(runs)
    out: dict[str, list[tuple[str, float]]] = {}
    for _, r in runs[runs["mode"] == "data+compute"].iterrows():
        key = f"{r['policy']}/{int(r['workers'])}"
        out.setdefault(key, []).append((blocks[str(r["run_id"])], float(r["throughput_samples_s"])))
    return out


def ratio(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> str:
    both = sorted({x for x, _ in a} & {x for x, _ in b})
    if both:
        per = [
            sum(v for x, v in a if x == blk)
            / sum(1 for x, _ in a if x == blk)
            / (sum(v for x, v in b if x == blk) / sum(1 for x, _ in b if x == blk))
            for blk in both
        ]
        r = log_ratio_interval(per)
        return f"{r.ratio:.2f} [{r.lo:.2f}, {r.hi:.2f}] (paired, n_blocks={r.n})"
    w = welch_interval([math.log(v) for _, v in a], [math.log(v) for _, v in b])
    lo, hi = math.exp(w.lo), math.exp(w.hi)
    return f"{math.exp(w.mean):.2f} [{lo:.2f}, {hi:.2f}] (unpaired Welch on logs, {w.n} runs)"


def main() -> int:
    root, advice = Path(sys.argv[1]), sys.argv[2]
    runs = pd.read_csv(root / "tables" / "runs.csv", dtype={"run_id": str}, low_memory=False)
    s = settings(runs)
    print(f"{root}: {len(runs)} runs")
    for key, vals in sorted(s.items(), key=lambda kv: -sum(v for _, v in kv[1]) / len(kv[1])):
        blocks = {b for b, _ in vals}
        per_block = [
            sum(v for b, v in vals if b == blk) / sum(1 for b, _ in vals if b == blk)
            for blk in sorted(blocks)
        ]
        m = mean_interval(per_block)
        print(
            f"  {key}: {m.mean:,.0f} samples/s [{m.lo:,.0f}, {m.hi:,.0f}]"
            f" (n_runs={len(vals)}, n_blocks={len(blocks)});"
            f" advice {advice} / this = {ratio(s[advice], vals) if key != advice else '-'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
