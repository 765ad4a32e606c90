"""What the per-call attribution of slow CUDA API calls costs on a long trace
(``codl.analysis.calls.attribute_trace(trace, twin)``, the `slow_calls` table of a run),
beside a baseline revision's in the same rounds.

For each size: writes a run's trace of N runtime calls with their scheduling evidence
(``events/cuda`` and ``events/cuda_sched``, as a ``cuda_api`` + ``cuda_api_sched`` run records
them: three API names, durations on a coarse grid, ~0.1 % of the calls 3-50x their name's
normal time, the first 2 % of steps warm-up) and its isolation twin's trace (N/3 calls), then
times the attribution, a process each, from cold files (``summarize_cost.timed``: wall and CPU
seconds, peak RSS, the codl sources byte-compiled first), and checks that every revision's
table is the same. Nothing here is derived: every number is timed.

    PYTHONPATH=src python benchmarks/attribution_cost.py --calls 1e6 1e7 [--repeat 3] [--csv PATH]
        [--baseline REV|NAME=DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from codl.measure import Recorder  # noqa: E402
from codl.trace.store import TraceWriter  # noqa: E402
from summarize_cost import (  # noqa: E402
    Round,
    baseline_src,
    compile_sources,
    drop_cache,
    record_rounds,
    report,
    timed,
)

DEFAULT_CSV = BENCH / "results" / "attribution_cost.csv"
ATTRIBUTE = """
import sys
from pathlib import Path
from codl.analysis import calls
calls.attribute_trace(Path(sys.argv[1]), Path(sys.argv[2])).to_csv(sys.argv[3], index=False)
"""
NAMES = ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize")
NORMAL_NS = 6_000
CHUNK = 1 << 20  # rows appended at a time: the generator's memory stays small
STEP_CALLS = 2_000


def _calls(rng: np.random.Generator, lo: int, hi: int, *, twin: bool) -> dict[str, np.ndarray]:
    idx = np.arange(lo, hi)
    which = np.where(idx % 97 == 0, 2, idx % 2)
    dur = NORMAL_NS * rng.integers(8, 13, len(idx)) // 10
    if not twin:
        slow = rng.random(len(idx)) < 0.001
        dur[slow] *= rng.integers(3, 50, int(slow.sum()))
    start = 10**12 + idx * 20_000
    return {
        "rank": np.zeros(len(idx), np.int16),
        "step": (idx // STEP_CALLS).astype(np.int32),
        "kind": np.where(which == 2, "sync", "runtime").tolist(),
        "name": np.asarray(NAMES)[which].tolist(),
        "tid": np.where(idx % 2, 11, 12),
        "stream": np.full(len(idx), -1),
        "correlation": idx,
        "start_ns": start,
        "end_ns": start + dur,
    }


def make_pair(path: Path, twin_path: Path, calls: int) -> None:
    """The run's trace at ``path`` and its twin's at ``twin_path``."""
    rng = np.random.default_rng(0)
    for where, n, is_twin in ((path, calls, False), (twin_path, calls // 3, True)):
        steps = n // STEP_CALLS
        with TraceWriter(where) as w:
            w.set_attrs(run_id=where.stem, warmup_steps=max(1, steps // 50), spec="{}")
            w.append(
                "threads",
                {"t_ns": [0, 0], "rank": [0, 0], "pid": [7, 7], "tid": [11, 12],
                 "role": ["launch", "autograd"], "name": ["python", "pt_autograd_0"],
                 "cpus_planned": ["", ""], "cpus_actual": ["0-3", "0-3"]},
            )  # fmt: skip
            for lo in range(0, n, CHUNK):
                rows = _calls(rng, lo, min(n, lo + CHUNK), twin=is_twin)
                w.append("events/cuda", rows)
                if not is_twin:
                    dur = rows["end_ns"] - rows["start_ns"]
                    slow = dur > 2 * NORMAL_NS
                    w.append(
                        "events/cuda_sched",
                        {
                            **{c: rows[c] for c in ("rank", "tid", "correlation")},
                            "start_ns": rows["start_ns"],
                            "end_ns": rows["end_ns"],
                            "thread_cpu_ns": np.where(slow, dur // 3, dur),
                            "voluntary": np.where(slow, rows["correlation"] % 3, 0),
                            "involuntary": np.where(slow, 1 + rows["correlation"] % 2, 0),
                            "cpu_entry": np.full(len(dur), 2, np.int16),
                            "cpu_exit": np.full(len(dur), 3, np.int16),
                        },
                    )
            w.finish()


def measure(
    rec: Recorder, calls: int, tmp: Path, repeat: int, baseline: tuple[str, Path] | None
) -> None:
    trace, twin = tmp / f"run{calls}.h5", tmp / f"twin{calls}.h5"
    make_pair(trace, twin, calls)
    py = sys.executable
    commands: dict[str, tuple[Path | None, Path]] = {
        "attribute_trace": (None, tmp / f"new{calls}.csv")
    }
    if baseline is not None:
        commands[f"attribute_trace @{baseline[0]}"] = (baseline[1], tmp / f"base{calls}.csv")
    runs: dict[str, list[Round]] = {w: [] for w in commands}
    rec.mark()
    for _ in range(repeat):
        for what, (src, out) in commands.items():
            drop_cache(twin)
            load = os.getloadavg()[0]
            cmd = [py, "-c", ATTRIBUTE, str(trace), str(twin), str(out)]
            runs[what].append((*timed(cmd, trace, src), load))
    tables = {what: pd.read_csv(out) for what, (_, out) in commands.items()}
    first = next(iter(tables.values()))
    same = all(first.equals(t) for t in tables.values())
    slow = {len(t) for t in tables.values()}
    size = {
        "calls": calls,
        # One count where every revision wrote the same table; "differ" says they did not.
        "slow_calls": slow.pop() if same else "differ",
        "trace_mib": round((trace.stat().st_size + twin.stat().st_size) / 2**20, 1),
    }
    record_rounds(rec, runs, size, items=calls, item="calls")
    trace.unlink()
    twin.unlink()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=float, nargs="+", default=[1e6, 1e7])
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    p.add_argument("--tmpdir", type=Path, default=None)
    p.add_argument("--repeat", type=int, default=3, help="rounds per size (median reported)")
    p.add_argument(
        "--baseline",
        metavar="REV|NAME=DIR",
        help="also time the attribution with the src/ of this git revision (or the src "
        "folder DIR, named NAME), in the same rounds",
    )
    args = p.parse_args()
    if args.repeat <= 0:
        p.error("--repeat must be positive")
    rec = Recorder()
    with tempfile.TemporaryDirectory(dir=args.tmpdir, prefix="codl-attr-") as tmp:
        base = baseline_src(args.baseline, Path(tmp)) if args.baseline else None
        compile_sources([base[1]] if base else [])
        for calls in args.calls:
            measure(rec, int(calls), Path(tmp), args.repeat, base)
    report(rec, args.csv, "attribute_trace" if base else None)


if __name__ == "__main__":
    main()
