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

Records every round's wall and CPU seconds (user + system, all threads) and peak RSS
(ru_maxrss) with the attribution rows, through ``codl.measure``: the table gives each median
(min-max) and the baseline's ratio, the CSV every round, the machine, its load and the commit.
Python's start and the imports are in every number. Nothing here is derived: every number is timed.

    PYTHONPATH=src python benchmarks/compare_cost.py --events 1e7 [--runs 4] [--repeat 3]
        [--csv PATH] [--baseline REV|NAME=DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from codl.measure import Recorder  # noqa: E402
from codl.paths import RunFiles  # noqa: E402
from codl.steps.analysis import summarize_to  # noqa: E402
from summarize_cost import (  # noqa: E402
    Round,
    baseline_src,
    compile_sources,
    drop_cache,
    record_rounds,
    report,
    timed,
)
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
    rec: Recorder,
    events: int,
    runs: int,
    tmp: Path,
    repeat: int,
    baseline: tuple[str, Path] | None,
) -> None:
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
    got: dict[str, list[Round]] = {w: [] for w in who}
    rec.mark()
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
    size = {"events_per_run": events, "runs": runs, "attribution_rows": attribution_rows}
    record_rounds(rec, got, size, items=n, item="events")
    for f in folders:
        shutil.rmtree(f.dir)
    for o in outs.values():
        shutil.rmtree(o)


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
    rec = Recorder()
    with tempfile.TemporaryDirectory(dir=args.tmpdir, prefix="codl-compare-") as tmp:
        base = baseline_src(args.baseline, Path(tmp)) if args.baseline else None
        compile_sources([base[1]] if base else [])
        for events in args.events:
            measure(rec, int(events), args.runs, Path(tmp), args.repeat, base)
    report(rec, args.csv, "compare_to" if base else None)


if __name__ == "__main__":
    main()
