"""What merging a multi-rank run's rank traces costs, the last step of its `codl run`.

A run of several ranks leaves one trace per rank; rank 0 (or the local launcher) merges them
into the run's trace with ``merge_rank_traces`` before `codl run` returns, and only then can
`codl summarize` (or the workflow's summarize rule) read it. For each size: writes the rank
traces of a 4-rank run (``synth_trace.make_rank_parts``: every table the tracer writes, a real
API-name mix), then, in rounds, merges a fresh copy of them in a process of its own, from cold
files (each part's pages dropped from the page cache before the round; where the OS refuses,
the row says "warm"), with this checkout's code and, with ``--baseline``, another revision's
in the same rounds. The merged traces of the two are checked to hold the same strings, root
attributes and column digests (every column's checksum, as ``Trace.verify`` checks them).

Records every round's wall and CPU seconds (the process's user + system time, all its
threads), events per second and per CPU-second and peak RSS (ru_maxrss) through
``codl.measure``: the table gives each median (min-max) and the baseline's ratio, the CSV every
round, the machine, its load and the commit. The merge is
timed as `codl run` calls it, in a process that imports it and merges (Python's start and the
imports in every number); a real multi-rank run at these sizes is hours of training.

    PYTHONPATH=src python benchmarks/merge_cost.py --events 1e7 1e8 [--repeat 3] [--csv PATH]
        [--baseline REV|NAME=DIR]
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
from codl.trace.store.merge import rank_trace_path  # noqa: E402
from summarize_cost import (  # noqa: E402
    Round,
    baseline_src,
    compile_sources,
    drop_cache,
    record_rounds,
    report,
    timed,
)
from synth_trace import make_rank_parts  # noqa: E402

DEFAULT_CSV = BENCH / "results" / "merge_cost.csv"
RANKS = 4
MERGE = """
import sys
from pathlib import Path
from codl.trace.store.merge import merge_rank_traces
merge_rank_traces(Path(sys.argv[1]), int(sys.argv[2]))
"""


def fresh_parts(pristine: Path, trace: Path) -> list[Path]:
    """A copy of the rank traces of ``pristine`` for ``trace`` (the merge removes the parts
    it merged), their pages dropped from the page cache; the merged trace of an earlier
    round removed."""
    trace.unlink(missing_ok=True)
    parts = []
    for r in range(RANKS):
        part = rank_trace_path(trace, r)
        shutil.copyfile(rank_trace_path(pristine, r), part)
        parts.append(part)
    return parts


def same_content(a: Path, b: Path) -> None:
    """Refuse two merged traces that differ in strings, root attributes or any column."""
    import h5py

    from codl.trace.store import open_trace

    with open_trace(a) as ta, open_trace(b) as tb:
        # Attribute values hold arrays and JSON documents: compared as the text they print as.
        attrs = [{k: str(v) for k, v in t.attrs.items()} for t in (ta, tb)]
        if ta.strings != tb.strings or attrs[0] != attrs[1] or ta.tables() != tb.tables():
            raise SystemExit(f"{a} and {b}: the merged traces differ (strings or attributes)")
        tables = ta.tables()
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        for name in tables:
            if {k: str(v) for k, v in fa[name].attrs.items()} != {
                k: str(v) for k, v in fb[name].attrs.items()
            }:
                raise SystemExit(f"{a} and {b}: /{name} differs (column digests or rows)")


def measure(
    rec: Recorder, events: int, tmp: Path, repeat: int, baseline: tuple[str, Path] | None
) -> None:
    pristine = tmp / f"p{events}" / "trace.h5"
    pristine.parent.mkdir()
    n = make_rank_parts(pristine, events, ranks=RANKS)
    part_bytes = sum(rank_trace_path(pristine, r).stat().st_size for r in range(RANKS))
    who: dict[str, Path | None] = {"merge_rank_traces": None}
    if baseline is not None:
        who[f"merge_rank_traces @{baseline[0]}"] = baseline[1]
    traces = {w: tmp / f"m{events}-{i}" / "trace.h5" for i, w in enumerate(who)}
    for trace in traces.values():
        trace.parent.mkdir()
    runs: dict[str, list[Round]] = {w: [] for w in who}
    rec.mark()
    for _ in range(repeat):
        for what, src in who.items():
            trace = traces[what]
            parts = fresh_parts(pristine, trace)
            cold = all([drop_cache(p) for p in parts])
            load = os.getloadavg()[0]
            cmd = [sys.executable, "-c", MERGE, str(trace), str(RANKS)]
            wall, cpu, rss, _ = timed(cmd, parts[0], src)
            runs[what].append((wall, cpu, rss, cold, load))
    if baseline is not None:
        same_content(*traces.values())
    size = {"events": n, "ranks": RANKS, "parts_mib": round(part_bytes / 2**20, 1)}
    record_rounds(rec, runs, size, items=n, item="events")
    shutil.rmtree(pristine.parent)
    for trace in traces.values():
        shutil.rmtree(trace.parent)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=float, nargs="+", default=[1e7])
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    p.add_argument("--tmpdir", type=Path, default=None)
    p.add_argument("--repeat", type=int, default=3, help="rounds per size (median reported)")
    p.add_argument(
        "--baseline",
        metavar="REV|NAME=DIR",
        help="also merge with the src/ of this git revision (or the src folder DIR, named "
        "NAME), in the same rounds, and check both merged traces hold the same",
    )
    args = p.parse_args()
    if args.repeat <= 0:
        p.error("--repeat must be positive")
    rec = Recorder()
    with tempfile.TemporaryDirectory(dir=args.tmpdir, prefix="codl-merge-") as tmp:
        base = baseline_src(args.baseline, Path(tmp)) if args.baseline else None
        compile_sources([base[1]] if base else [])
        for events in args.events:
            measure(rec, int(events), Path(tmp), args.repeat, base)
    report(rec, args.csv, "merge_rank_traces" if base else None)


if __name__ == "__main__":
    main()
