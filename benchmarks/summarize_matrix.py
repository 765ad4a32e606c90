"""How many cores a `codl summarize` job should get: one trace by the cores it is given, and a
matrix's traces summarized as the workflow's `summarize` rule runs them.

The rule asks for one thread (`threads: 1`), so Snakemake runs as many summarize jobs at once
as it has cores (`--cores`, or `--local-cores` under Slurm, where summarize is a local rule),
and each job decodes and reduces on every core of the machine (`chunked.default_threads`):
the jobs share the cores through the OS. The alternative is to give each job T cores of its
own and run cores / T jobs at once. This benchmark times both, with `codl summarize`, the
command the rule's script runs (`steps.analysis.summarize_to`), each job from a cold file:

- ``one trace``: a trace summarized by a process confined to N cores (`taskset`), as a job
  given N cores would be;
- ``matrix``: TRACES copies of one trace summarized by J jobs at once, each confined to its own
  T cores (J x T = the machine's cores), or, with T = "all", unconfined, as the rule's jobs
  are; the makespan (first start to last end) is reported.

Rounds alternate the layouts; every layout's rounds are recorded (``codl.measure``: the table
gives the median and the range), with the CPU seconds of all its jobs (their user + system
time). With
``--baseline``, only the rule's layout is timed, for this checkout and for the baseline's
``src`` in turn (which goes first alternates by round): a before/after of what a matrix's
summarize jobs cost one another. Linux only (`taskset`, `posix_fadvise`).

    PYTHONPATH=src python benchmarks/summarize_matrix.py --events 1e7 1e8 [--traces 16]
        [--repeat 2] [--csv PATH] [--baseline REV|NAME=DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from codl.measure import Recorder  # noqa: E402
from summarize_cost import (  # noqa: E402
    baseline_src,
    compile_sources,
    drop_cache,
    report,
    src_env,
    summarize_cmd,
)
from synth_trace import make_trace  # noqa: E402

DEFAULT_CSV = BENCH / "results" / "summarize_matrix.csv"


def confined(cmd: list[str], cores: list[int] | None) -> list[str]:
    """``cmd`` run on ``cores`` only (None: wherever the OS puts it)."""
    if cores is None:
        return cmd
    taskset = shutil.which("taskset")
    if taskset is None:
        raise SystemExit("taskset not found (util-linux): this benchmark needs it")
    return [taskset, "-c", ",".join(map(str, cores)), *cmd]


Run = tuple[float, float, bool]  # makespan, CPU seconds of all jobs, every trace read cold


def makespan(
    traces: list[Path], out: Path, jobs: int, per_job: int | None, src: Path | None = None
) -> Run:
    """Seconds from the first job's start to the last one's end: ``traces`` summarized by
    ``jobs`` at once, job slot i on cores i*per_job.. (None: every job unconfined); the
    jobs' CPU seconds; and whether every trace was read cold. ``src``: the jobs import
    ``codl`` from there (a baseline's)."""
    env = src_env(src)
    allowed = sorted(os.sched_getaffinity(0))
    slots = [
        None if per_job is None else allowed[i * per_job : (i + 1) * per_job] for i in range(jobs)
    ]
    cold = all([drop_cache(t) for t in traces])
    shutil.rmtree(out, ignore_errors=True)
    pending = list(enumerate(traces))
    running: dict[int, subprocess.Popen[bytes]] = {}  # job slot -> its job
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    while pending or running:
        for slot in [s for s in range(jobs) if s not in running][: len(pending)]:
            i, trace = pending.pop(0)
            cmd = confined(summarize_cmd(trace, out / str(i)), slots[slot])
            running[slot] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
        time.sleep(0.002)
        for slot, job in list(running.items()):
            if job.poll() is not None:
                if job.returncode:
                    raise SystemExit(f"{job.args} failed ({job.returncode})")
                del running[slot]
    wall = time.perf_counter() - start
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    return wall, cpu, cold


def layouts(cores: int) -> list[tuple[int, int | None]]:
    """(jobs at once, cores per job): the rule's (every job unconfined), then J x T = cores."""
    out: list[tuple[int, int | None]] = [(cores, None)]
    out += [(cores // t, t) for t in (1, 2, 4, 8) if t <= cores and cores % t == 0]
    return out


def record(
    rec: Recorder, events: int, what: str, jobs: int, per_job: int | None, runs: list[Run]
) -> None:
    how = "makespan, cold files" if all(r[2] for r in runs) else "makespan, warm files"
    s = {
        "what": what,
        "events": events,
        "jobs_at_once": jobs,
        "cores_per_job": "all" if per_job is None else per_job,
    }
    rec.add("wall", (r[0] for r in runs), unit="s", statistic=how, settings=s)
    rec.add("cpu", (r[1] for r in runs), unit="s", statistic="all jobs, user + system", settings=s)


def measure(
    rec: Recorder,
    events: int,
    tmp: Path,
    traces: int,
    repeat: int,
    baseline: tuple[str, Path] | None = None,
) -> None:
    first = tmp / "t0.h5"
    n = make_trace(first, events)
    copies = [first] + [tmp / f"t{i}.h5" for i in range(1, traces)]
    for c in copies[1:]:
        shutil.copyfile(first, c)
    cores = len(os.sched_getaffinity(0))
    rec.mark()
    if baseline is not None:
        against(rec, n, copies, tmp, cores, repeat, baseline)
    else:
        by_layout(rec, n, copies, tmp, cores, repeat)
    for c in copies:
        c.unlink()


def against(
    rec: Recorder,
    n: int,
    copies: list[Path],
    tmp: Path,
    cores: int,
    repeat: int,
    baseline: tuple[str, Path],
) -> None:
    """The rule's layout, this checkout's code and the baseline's in turn."""
    rev, src = baseline
    codes: dict[str, Path | None] = {"": None, f" @{rev}": src}
    runs: dict[str, list[Run]] = {k: [] for k in codes}
    for i in range(repeat):
        for k in list(codes)[:: 1 if i % 2 == 0 else -1]:
            runs[k].append(makespan(copies, tmp / "out", cores, None, codes[k]))
    for k, got in runs.items():
        record(rec, n, f"matrix of {len(copies)}{k}", cores, None, got)


def by_layout(
    rec: Recorder, n: int, copies: list[Path], tmp: Path, cores: int, repeat: int
) -> None:
    first = copies[0]
    single = [c for c in (cores, 8, 4, 2, 1) if c <= cores]
    one: dict[int, list[Run]] = {c: [] for c in dict.fromkeys(single)}
    matrix: dict[tuple[int, int | None], list[Run]] = {lay: [] for lay in layouts(cores)}
    for _ in range(repeat):
        for c, got in one.items():
            got.append(makespan([first], tmp / "out", 1, c))
        for (jobs, per_job), got in matrix.items():
            got.append(makespan(copies, tmp / "out", jobs, per_job))
    for c, got in one.items():
        record(rec, n, "one trace", 1, c, got)
    for (j, t), got in matrix.items():
        record(rec, n, f"matrix of {len(copies)}", j, t, got)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=float, nargs="+", default=[1e7])
    p.add_argument("--traces", type=int, default=16, help="traces in the matrix")
    p.add_argument("--repeat", type=int, default=2, help="rounds (median reported)")
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    p.add_argument("--tmpdir", type=Path, default=None)
    p.add_argument(
        "--baseline",
        metavar="REV|NAME=DIR",
        help="time only the rule's layout, for this checkout and for the src/ of this git "
        "revision (or the src folder DIR, named NAME), in turn",
    )
    args = p.parse_args()
    if args.repeat <= 0 or args.traces <= 0:
        p.error("--repeat and --traces must be positive")
    rec = Recorder()
    with tempfile.TemporaryDirectory(dir=args.tmpdir, prefix="codl-matrix-") as tmp:
        base = baseline_src(args.baseline, Path(tmp)) if args.baseline else None
        compile_sources([base[1]] if base else [])
        for events in args.events:
            measure(rec, int(events), Path(tmp), args.traces, args.repeat, base)
    report(rec, args.csv, f"matrix of {args.traces}" if base else None)


if __name__ == "__main__":
    main()
