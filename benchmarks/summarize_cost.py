"""What `codl summarize` costs on a long trace, beside a plain h5py read of the same columns.

For each size: writes a realistic trace (``synth_trace.make_trace``: 4 ranks, every table the
tracer writes, a real API-name mix), then, each in its own process and from a cold file (its
pages dropped from the page cache with posix_fadvise(DONTNEED) before every run; where the OS
refuses, the row says "warm"):

- ``codl summarize TRACE --out-dir DIR``, the command a user types;
- the workflow rule's function (``steps.analysis.summarize_to``, as workflow/scripts/summarize.py
  calls it);
- a plain h5py read of the columns summarize reads (every column of the small tables; of
  events/cuda and events/loader those of ``chunked.READ_COLUMNS``), whole columns into memory;
- ``imports only``: Python started and the modules ``codl summarize`` imports, no trace read
  (what every run costs whatever its size);
- ``codl inspect TRACE``, a user's first look at the same trace;
- with ``--calls``, ``codl summarize TRACE --out-dir DIR --calls``: the same, and the per-call
  table a user asks for (``calls.parquet``, a row per CUDA runtime API call), in its own pass.

Records (``codl.measure``) each command's rounds of wall seconds and CPU seconds (the child's
user + system time, all its threads and child processes), events per second and per CPU-second
(what "per core" means here, whatever else the machine runs), peak RSS (the child's ru_maxrss
or, where larger, the summed PSS of its process tree sampled every 20 ms in one more round of each
command, kept out of the timed ones, whose wall time is reported apart; the child forked
from a small launcher: see LAUNCH); the table gives each one's median (min-max) and its ratio
to the plain read's median; the CSV has every round, the machine, its load and the commit.
Every process starts cold: Python, its imports and the file's open are in every
number. The codl sources timed are byte-compiled first, as an installed copy is
(``compile_sources``). Nothing here is derived: every number is timed.

    PYTHONPATH=src python benchmarks/summarize_cost.py --events 1e6 1e7 [--repeat 3] [--csv PATH]
        [--baseline REV|NAME=DIR]  # and `codl summarize`, `codl inspect` of revision REV, in the
                                   # same rounds
        [--calls]                  # and `codl summarize --calls`
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from codl.measure import Recorder, table  # noqa: E402
from synth_trace import make_trace  # noqa: E402

DEFAULT_CSV = BENCH / "results" / "summarize_cost.csv"
# Python, h5py and the Blosc filter only (no pandas, no codl): the physical limit of reading
# the columns; the tables and columns come in as JSON (``plain_columns``).
PLAIN_READ = """
import json, sys, h5py, hdf5plugin
with h5py.File(sys.argv[1], "r") as f:
    for name, cols in json.loads(sys.argv[2]).items():
        if name in f:
            for col in cols or list(f[name]):
                f[name][col][()]
"""
WORKFLOW = """
import sys
from pathlib import Path
from codl.blas import one_blas_thread
one_blas_thread()
from codl.paths import RunFiles
from codl.steps.analysis import summarize_to
summarize_to(Path(sys.argv[1]), **RunFiles(Path(sys.argv[2])).tables())
"""

# As `codl summarize` loads them: one OpenBLAS thread asked for first (codl.blas).
IMPORTS = (
    "from codl.blas import one_blas_thread; one_blas_thread(); import codl.cli, codl.steps.analysis"
)


def plain_columns() -> str:
    """The tables summarize reads and, of the two big ones, the columns it reads (empty: all)."""
    from codl.analysis.chunked import READ_COLUMNS
    from codl.analysis.columns import SUMMARY_TABLES

    return json.dumps({str(n): READ_COLUMNS.get(n, []) for n in SUMMARY_TABLES})


def drop_cache(path: Path) -> bool:
    """Drop the file's pages from the page cache; False where the OS does not."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        return False
    return True


# Starts the command in a process forked from a small one, and reports its wall time and
# rusage. A child spawned from this script directly inherits its peak RSS: Linux carries the
# parent's high-water mark into a vfork()ed child's ru_maxrss at exec (this script holds the
# trace writer's ~250 MiB, which then showed as every command's floor, the plain read's too).
# The rusage of a process that forks children of its own (summarize's loader process) has
# the largest process's high-water mark, not their sum: asked to (argv[2] == "1"), the
# launcher also samples the command's process tree every 20 ms (psutil) and reports the
# larger of the two. The tree is summed in PSS (each page shared by n processes counted 1/n
# in each), so that the pages a forked child shares with its parent count once. Reading a
# process's PSS walks its page tables under its memory map's lock, so the rounds that are
# timed run without the sampler and one more round of each command samples (``measure``),
# its wall time reported apart (``sampled_round_s``: within the timed rounds' spread at every
# size measured, on both machines).
LAUNCH = """
import json, os, sys, threading, time
import psutil
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[3], sys.argv[3:])
most, ended = [0], threading.Event()
def sample():
    tree = psutil.Process(pid)
    while not ended.wait(0.02):
        try:
            procs = [tree, *tree.children(recursive=True)]
        except psutil.Error:
            continue
        pss = 0
        for p in procs:
            try:
                pss += p.memory_full_info().pss
            except psutil.Error:
                pass
        most[0] = max(most[0], pss)
sampler = threading.Thread(target=sample, daemon=True)
if sys.argv[2] == "1":
    sampler.start()
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
ended.set()
if sampler.is_alive():
    sampler.join()
peak = max(usage.ru_maxrss / 1024, most[0] / 2**20)
with open(sys.argv[1], "w") as fh:
    json.dump([wall, usage.ru_utime + usage.ru_stime, peak], fh)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def src_env(src: Path | None) -> dict[str, str] | None:
    """The environment of a child that imports ``codl`` from ``src`` (a baseline's checkout);
    None (this process's own) for this checkout's."""
    if src is None:
        return None
    # Ahead of the rest (this checkout's src, the packages): its codl is the one imported.
    path = [str(src), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def timed(
    cmd: list[str], trace: Path, src: Path | None = None, *, sample: bool = False
) -> tuple[float, float, float, bool]:
    """(wall seconds, CPU seconds, peak memory MiB, cold) of one child process (and its
    threads and children: ru_utime + ru_stime), as the launcher (LAUNCH) measured them;
    ``src``: the ``codl`` package it imports comes from there (a baseline's checkout);
    ``sample``: the peak is the process tree's summed PSS where larger than ru_maxrss (a
    round for its memory: the sampler reads the command's page tables as it runs)."""
    cold = drop_cache(trace)
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        launch = [sys.executable, "-c", LAUNCH, report.name, str(int(sample)), *cmd]
        code = subprocess.run(
            launch, stdout=subprocess.DEVNULL, env=src_env(src), check=False
        ).returncode
        if code:
            raise SystemExit(f"{cmd} failed ({code})")
        wall, cpu, rss = json.loads(Path(report.name).read_text())
    return wall, cpu, rss, cold


def summarize_cmd(trace: Path, out: Path, *extra: str) -> list[str]:
    """`codl summarize TRACE --out-dir OUT [EXTRA]`, as a user types it (warnings only on
    stderr)."""
    cli = [sys.executable, "-m", "codl.cli", "--log-level", "WARNING"]
    return [*cli, "summarize", str(trace), "--out-dir", str(out), *extra]


def inspect_cmd(trace: Path) -> list[str]:
    """`codl inspect TRACE`, as a user types it."""
    return [sys.executable, "-m", "codl.cli", "--log-level", "WARNING", "inspect", str(trace)]


def baseline_src(baseline: str, tmp: Path) -> tuple[str, Path]:
    """(name, src folder) of ``--baseline``: ``NAME=DIR`` names a ``src`` folder already
    there (a machine without the repository's history); else a git revision of this
    checkout, whose ``src`` is exported under ``tmp``."""
    name, sep, folder = baseline.partition("=")
    if sep:
        if not (Path(folder) / "codl").is_dir():
            raise SystemExit(f"--baseline {baseline}: {folder} holds no codl package")
        return name, Path(folder).resolve()
    rev, root = baseline, BENCH.parent
    out = tmp / f"baseline-{rev}"
    out.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", rev, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return rev, out / "src"


def compile_sources(srcs: list[Path]) -> None:
    """Byte-compile each ``codl`` package timed (this checkout's and a baseline's), as
    installing a package does: a run under ``PYTHONDONTWRITEBYTECODE`` (set on some machines,
    and on ours) or from a tree never run before would otherwise compile ~40 modules in every
    process, ~0.1 s that no installed copy pays."""
    import codl

    for src in {Path(codl.__file__).resolve().parent.parent, *srcs}:
        if not compileall.compile_dir(src / "codl", quiet=1):
            raise SystemExit(f"{src / 'codl'}: could not byte-compile")


def measure(
    rec: Recorder,
    events: int,
    tmp: Path,
    repeat: int,
    baseline: tuple[str, Path] | None = None,
    *,
    calls: bool = False,
) -> None:
    trace = tmp / f"t{events}.h5"
    n = make_trace(trace, events)
    py = sys.executable
    commands = {
        "plain h5py read": [py, "-c", PLAIN_READ, str(trace), plain_columns()],
        "codl summarize": summarize_cmd(trace, tmp / f"cli{events}"),
        "workflow summarize_to": [py, "-c", WORKFLOW, str(trace), str(tmp / f"wf{events}")],
        # The floor every run of the command pays whatever the trace: Python's start and the
        # imports `codl summarize` makes (pandas, h5py, numpy), reading nothing.
        "imports only": [py, "-c", IMPORTS],
        # A user's first look at the trace: every table's rows counted, every block checked.
        "codl inspect": inspect_cmd(trace),
    }
    if calls:
        commands["codl summarize --calls"] = summarize_cmd(trace, tmp / f"calls{events}", "--calls")
    # The same command from a baseline revision's code, in the same rounds: a before/after
    # measured side by side.
    srcs: dict[str, Path] = {}
    if baseline is not None:
        rev, src = baseline
        what = f"codl summarize @{rev}"
        commands[what] = summarize_cmd(trace, tmp / f"base{events}")
        srcs[what] = src
        commands[f"codl inspect @{rev}"] = inspect_cmd(trace)
        srcs[f"codl inspect @{rev}"] = src
    # Rounds of the commands in turn, so that the machine's other load falls on each alike;
    # every round is recorded, and the table shows each one's median beside its range.
    runs: dict[str, list[Round]] = {w: [] for w in commands}
    rec.mark()
    for _ in range(repeat):
        for what, cmd in commands.items():
            load = os.getloadavg()[0]
            runs[what].append((*timed(cmd, trace, srcs.get(what)), load))
    # One more round of each, for its memory alone (LAUNCH: the sampler is kept out of the
    # timed rounds).
    sampled = {w: timed(cmd, trace, srcs.get(w), sample=True) for w, cmd in commands.items()}
    size = {"events": n, "trace_mib": round(trace.stat().st_size / 2**20, 1)}
    record_rounds(rec, runs, size, items=n, item="events")
    for what, (wall, _cpu, rss, _cold) in sampled.items():
        s = {"what": what, **size}
        rec.add("peak memory", [rss], unit="MiB", statistic="max(ru_maxrss, sampled PSS)",
                settings=s)  # fmt: skip
        # The memory round's wall time: whether the sampler cost the command any.
        rec.add("wall, memory round", [wall], unit="s", statistic="process", settings=s)
    trace.unlink()


# (wall seconds, CPU seconds, peak RSS MiB, cold, load): one round of one command (``timed``).
Round = tuple[float, float, float, bool, float]


def record_rounds(
    rec: Recorder,
    rounds: dict[str, list[Round]],
    settings: Mapping[str, object],
    *,
    items: int,
    item: str,
) -> None:
    """Each command's rounds as measurements: wall and CPU seconds, ``item``s per second and
    per CPU-second, peak RSS; ``what`` (the command) is the setting a table spreads out, beside
    ``settings``."""
    for what, got in rounds.items():
        how = "cold process" if all(r[3] for r in got) else "warm process (cache not dropped)"
        s = {"what": what, **settings}
        rec.add("wall", (r[0] for r in got), unit="s", statistic=how, settings=s)
        rec.add("cpu", (r[1] for r in got), unit="s", statistic=f"{how}, user + system", settings=s)
        rec.add(f"{item}/s", (items / r[0] for r in got), unit="1/s", statistic=how, settings=s)
        rec.add(f"{item}/cpu-s", (items / r[1] for r in got), unit="1/s", statistic=how, settings=s)
        rec.add("peak rss", (r[2] for r in got), unit="MiB", statistic="ru_maxrss", settings=s)


def report(rec: Recorder, path: Path, baseline: str | None) -> None:
    """The table (commands as columns, ratios to ``baseline``) and the CSV, one schema."""
    print(table(rec.measurements, column="what", baseline=baseline))
    rec.write(path)
    print(f"# wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=float, nargs="+", default=[1e6, 1e7])
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    p.add_argument("--tmpdir", type=Path, default=None)
    p.add_argument("--repeat", type=int, default=3, help="rounds per size (median reported)")
    p.add_argument(
        "--baseline",
        metavar="REV|NAME=DIR",
        help="also time `codl summarize` and `codl inspect` with the src/ of this git revision "
        "(or the src folder DIR, named NAME), in the same rounds",
    )
    p.add_argument(
        "--calls",
        action="store_true",
        help="also time `codl summarize --calls` (the per-call table)",
    )
    args = p.parse_args()
    if args.repeat <= 0:
        p.error("--repeat must be positive")
    rec = Recorder()
    with tempfile.TemporaryDirectory(dir=args.tmpdir, prefix="codl-summ-") as tmp:
        base = baseline_src(args.baseline, Path(tmp)) if args.baseline else None
        compile_sources([base[1]] if base else [])
        for events in args.events:
            measure(rec, int(events), Path(tmp), args.repeat, base, calls=args.calls)
    report(rec, args.csv, "plain h5py read")


if __name__ == "__main__":
    main()
