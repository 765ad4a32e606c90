"""What the workflow's compare rule costs on a matrix of long runs.

The compare rule reads every run's summarize tables and writes the merged tables
(``runs.csv``, ``steps.csv``, ``comparison.csv``, ``attribution.csv``, ``decomposition.csv``).
Of these, the attribution grows with a run's steps: a row per (rank, measured step, thread
that ran on the launch thread's CPUs), ~10^6 rows per 10^8-event run. For each size: writes
``--runs`` realistic traces (``synth_trace.make_trace``, each its own repeat and run id),
summarizes each once (``summarize_to``, untimed), then, in rounds, runs the rule's function
(``steps.analysis.compare_to``, as workflow/scripts/compare.py calls it) in a process of its
own, from cold inputs (the run tables' pages dropped from the page cache; where the OS refuses,
the row says "warm"), with this checkout's code and, with ``--baseline``, another revision's in
the same rounds. The tables both write are checked to be the same text.

Reports the median round's wall and CPU seconds (user + system, all threads), peak RSS
(ru_maxrss), the attribution rows, the fastest and slowest rounds, the machine's highest
1-minute load over the rounds and its core count. Python's start and the imports are in every
number. Nothing here is derived: every number is timed.

    PYTHONPATH=src python benchmarks/compare_cost.py --events 1e7 [--runs 4] [--repeat 3]
        [--csv PATH] [--baseline REV|NAME=DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from codl.paths import RunFiles  # noqa: E402
from codl.steps.analysis import summarize_to  # noqa: E402
from summarize_cost import baseline_src, compile_sources, drop_cache, timed, write_rows  # noqa: E402
from synth_trace import make_trace  # noqa: E402

DEFAULT_CSV = BENCH / "results" / "compare_cost.csv"
TABLES = ("runs", "steps", "comparison", "attribution", "decomposition")
# The compare rule's function, on run folders given as arguments after the output folder.
COMPARE = f"""
import sys
from pathlib import Path
from codl.paths import RunFiles
from codl.steps.analysis import compare_to
out, runs = Path(sys.argv[1]), [RunFiles(Path(d)) for d in sys.argv[2:]]
compare_to(
    summaries=[r.summary for r in runs],
    steps=[r.steps for r in runs],
    attributions=[r.attribution for r in runs],
    parts=[r.parts for r in runs],
    **{{f"{{t}}_table": out / f"{{t}}.csv" for t in {TABLES!r}}},
)
"""


def same_tables(a: Path, b: Path) -> None:
    """Both compare outputs hold the same text, table by table."""
    for t in TABLES:
        if (a / f"{t}.csv").read_bytes() != (b / f"{t}.csv").read_bytes():
            raise SystemExit(f"{t}.csv differs between {a} and {b}")


def measure(
    events: int, runs: int, tmp: Path, repeat: int, baseline: tuple[str, Path] | None
) -> list[dict[str, object]]:
    folders = []
    n = 0
    for i in range(runs):
        trace = tmp / f"t{events}-{i}.h5"
        n += make_trace(trace, events, repeat=i)
        folders.append(RunFiles(tmp / f"r{events}-{i}"))
        summarize_to(trace, **folders[-1].tables())
        trace.unlink()
    who: dict[str, Path | None] = {"compare_to": None}
    if baseline is not None:
        who[f"compare_to @{baseline[0]}"] = baseline[1]
    outs = {w: tmp / f"c{events}-{i}" for i, w in enumerate(who)}
    inputs = [p for f in folders for p in f.tables().values()]
    got: dict[str, list[tuple[float, float, float, bool, float]]] = {w: [] for w in who}
    for _ in range(repeat):
        for what, src in who.items():
            shutil.rmtree(outs[what], ignore_errors=True)
            cold = all([drop_cache(p) for p in inputs])
            load = os.getloadavg()[0]
            cmd = [sys.executable, "-c", COMPARE, str(outs[what]), *(str(f.dir) for f in folders)]
            wall, cpu, rss, _ = timed(cmd, inputs[0], src)
            got[what].append((wall, cpu, rss, cold, load))
    if baseline is not None:
        same_tables(*outs.values())
    with (outs["compare_to"] / "attribution.csv").open("rb") as fh:
        attribution_rows = sum(1 for _ in fh) - 1
    rows = []
    for what, r in got.items():
        rows.append(
            {
                "events_per_run": events,
                "runs": runs,
                "events": n,
                "what": what,
                "seconds": round(statistics.median(x[0] for x in r), 3),
                "cpu_seconds": round(statistics.median(x[1] for x in r), 3),
                "peak_rss_mib": round(max(x[2] for x in r), 1),
                "attribution_rows": attribution_rows,
                "rounds": len(r),
                "fastest_round_s": round(min(x[0] for x in r), 3),
                "slowest_round_s": round(max(x[0] for x in r), 3),
                "cache": "cold" if all(x[3] for x in r) else "warm",
                "load_1m": round(max(x[4] for x in r), 2),
                "cores": os.cpu_count(),
            }
        )
        print(rows[-1], flush=True)
    for f in folders:
        shutil.rmtree(f.dir)
    for o in outs.values():
        shutil.rmtree(o)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=float, nargs="+", default=[1e7], help="events per run")
    p.add_argument("--runs", type=int, default=4, help="runs in the matrix")
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    p.add_argument("--tmpdir", type=Path, default=None)
    p.add_argument("--repeat", type=int, default=3, help="rounds per size (median reported)")
    p.add_argument(
        "--baseline",
        metavar="REV|NAME=DIR",
        help="also compare with the src/ of this git revision (or the src folder DIR, named "
        "NAME), in the same rounds, and check both write the same tables",
    )
    args = p.parse_args()
    if args.repeat <= 0 or args.runs <= 0:
        p.error("--repeat and --runs must be positive")
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(dir=args.tmpdir, prefix="codl-compare-") as tmp:
        base = baseline_src(args.baseline, Path(tmp)) if args.baseline else None
        compile_sources([base[1]] if base else [])
        for events in args.events:
            rows += measure(int(events), args.runs, Path(tmp), args.repeat, base)
    write_rows(rows, args.csv)


if __name__ == "__main__":
    main()
