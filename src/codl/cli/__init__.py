"""`codl` command line: run | inspect | export | convert | plan | dataset | write-spec | stage |
summarize | advise."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from codl import __version__
from codl.blas import one_blas_thread
from codl.claims import cli as claims_cli
from codl.cli import makespan as makespan_cli
from codl.cli.options import MAX_CORES, Parser, bounded_int, export_time, finite_float
from codl.errors import CodlError, RunInterruptedError
from codl.log import LEVELS, configure
from codl.paths import RunFiles

log = logging.getLogger(__name__)


def _not_a_directory(path: Path, expected: str, name: str | None = None) -> None:
    """A one-line error when ``path`` is a directory: ``codl inspect results/runs`` names the file
    it expected (and the file called ``name`` inside, when there is one) instead of
    ``[Errno 21]`` or "no such file"."""
    if Path(path).is_dir():
        inside = Path(path) / name if name else None
        hint = f" (did you mean {inside}?)" if inside is not None and inside.is_file() else ""
        raise CodlError(f"{path}: is a directory, expected {expected}{hint}")


def _load_spec(path: Path) -> Any:
    from codl.spec import RunSpec, loads_json

    _not_a_directory(path, "a run's spec file", RunFiles(Path(path)).spec.name)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise CodlError(f"{path}: no such spec file") from None
    return RunSpec.from_dict(loads_json(text, source=str(path)))


def _check_run_args(args: argparse.Namespace, spec: Any) -> Path:
    """Everything ``codl run`` can check before it imports torch and starts measuring."""
    from codl.datasets import check_dataset
    from codl.outputs import same_file
    from codl.trace.store import check_trace_target

    trace = Path(args.trace) if args.trace else RunFiles(Path(args.spec).parent).trace
    if same_file(trace, Path(args.spec)):
        raise CodlError(f"--trace {trace} is the spec file; it would be overwritten")
    if args.kineto_dir and Path(args.kineto_dir).exists() and not Path(args.kineto_dir).is_dir():
        raise CodlError(f"--kineto-dir {args.kineto_dir} exists and is not a directory")
    if spec.mode.loads:
        from codl.pinning import rank_split, task_bound
        from codl.spec import WORKERS_PER_CPU

        # Oversubscription is an experiment factor, a fork per worker far past the CPUs is not.
        # A core budget (pinning.cpus) is the rank's CPUs; too large a one fails at run start.
        # A Slurm task bound to its own CPUs does not share them with the node's other ranks.
        sharing, _ = rank_split(spec.layout.ranks_per_node, 0, bound=task_bound(os.environ))
        cpus = (
            spec.pinning.cpus
            or args.cpus_per_task
            or max(1, len(os.sched_getaffinity(0)) // sharing)
        )
        if spec.loader.workers > WORKERS_PER_CPU * cpus:
            raise CodlError(
                f"loader.workers: got {spec.loader.workers}, expected <= {WORKERS_PER_CPU} per "
                f"CPU of a rank ({cpus} CPUs here: at most {WORKERS_PER_CPU * cpus})"
            )
        if not args.dataset_dir:
            raise CodlError(f"mode {spec.mode.value!r} reads a data set: give --dataset-dir")
        check_dataset(spec.dataset, Path(args.dataset_dir))
    return check_trace_target(trace)


def cmd_run(args: argparse.Namespace) -> int:
    spec = _load_spec(args.spec)
    trace = _check_run_args(args, spec)
    log.info(
        "run %s: mode %s, policy %s, %d rank(s), %d warm-up + %d measured steps -> %s",
        spec.run_id,
        spec.mode.value,
        spec.pinning.policy.value,
        spec.layout.world_size,
        spec.steps.warmup,
        spec.steps.measured,
        trace,
    )
    t0 = time.monotonic()
    # Imported only now: torch takes seconds to import, a spec error should not.
    from codl.harness.launch import launch

    try:
        launch(
            spec,
            trace_path=trace,
            dataset_dir=Path(args.dataset_dir) if args.dataset_dir else None,
            kineto_dir=Path(args.kineto_dir) if args.kineto_dir else RunFiles(trace.parent).kineto,
            argv=[sys.executable, "-m", "codl.cli", *sys.argv[1:]],
            cpus_per_task=args.cpus_per_task,
        )
    except RunInterruptedError:
        # Stopped, its trace written: the exit status (2) is decided. The rest of the kill
        # (Slurm and group-wide kills repeat it) is ignored until the process is gone: CPython
        # puts the default handler back over every Python-level one (the runner's grace handler
        # included) when it finalizes, and a repeat landing in the second or so that torch's
        # teardown takes would end the process by the signal instead (rc -15).
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        raise
    log.info("run %s: wrote %s in %.1f s", spec.run_id, trace, time.monotonic() - t0)
    print(trace)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from codl.analysis.inspect import describe, render

    _not_a_directory(args.trace, "a trace file", RunFiles(Path(args.trace)).trace.name)
    info = describe(Path(args.trace), allow_incomplete=args.allow_incomplete)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True, default=str))
    else:
        print(render(info))
    return 0


def _trace_input(path: Path) -> None:
    """A one-line error for a trace argument that cannot be a trace: a directory (naming the
    trace inside), a device, a pipe or a socket (HDF5 reads a file it can seek in)."""
    _not_a_directory(path, "a trace file", RunFiles(path).trace.name)
    if path.exists() and not path.is_file():
        raise CodlError(
            f"{path}: not a regular file (a device, pipe or socket?), expected a trace file (HDF5)"
        )


def cmd_export(args: argparse.Namespace) -> int:
    from codl.outputs import OutputKind, check_output
    from codl.trace.export import TimePoint, empty_window_text, export_chrome

    start = TimePoint(*args.start) if args.start is not None else None
    end = TimePoint(*args.end) if args.end is not None else None
    # Bounds on one clock are compared now; an axis time against a mono: one once the trace
    # (its zero) is open.
    if start and end and start.monotonic == end.monotonic and end.ns <= start.ns:
        raise CodlError(empty_window_text(start, end))
    trace = Path(args.trace)
    _trace_input(trace)
    out = Path(args.output)
    # Checked before the trace is read: a refused output costs no time.
    kind = check_output(out, inputs=(trace,), option="-o/--output")
    if args.format == "perfetto-proto":
        from codl.trace.perfetto_proto import export_perfetto

        export_perfetto(trace, out, start=start, end=end, option="-o/--output")
    else:
        export_chrome(trace, out, start=start, end=end, option="-o/--output")
    if kind is OutputKind.FILE:  # a stream (-o /dev/stdout) gets the trace alone
        print(args.output)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from codl.trace.store.convert import convert_trace

    src, out = Path(args.trace), Path(args.output)
    _trace_input(src)
    if src.name.endswith((".json", ".json.gz")) and src.is_file():
        # The likely mix-up: convert copies a codl trace; a run converts its Kineto trace.
        raise CodlError(
            f"{src}: a JSON file (a Kineto or Chrome trace?), expected a codl trace (HDF5): "
            "codl convert copies a trace with another codec; a run converts its Kineto trace "
            "into its codl trace itself (trace.cupti)"
        )
    # convert_trace checks the codec and the output before it reads anything, then verifies
    # the input before copying it (a damaged column is named as the input's).
    convert_trace(src, out, compression=args.compression, allow_incomplete=args.allow_incomplete)
    print(args.output)
    return 0


def _plan_target_ci(args: argparse.Namespace) -> int:
    """``codl plan CONFIG --target-ci P``: the repeats each comparison of the pilot's runs table
    needs for +/- P points (codl.analysis.repeats), after the config is checked."""
    import pandas as pd

    from codl.analysis.repeats import plan_repeats
    from codl.config import build_plan, load_yaml
    from codl.paths import ResultPaths, set_name_of

    cfg = load_yaml(Path(args.config))
    build_plan(cfg, source=str(args.config))
    pilot = (
        Path(args.pilot)
        if args.pilot is not None
        else ResultPaths(set_name=set_name_of(cfg, [args.config])).runs_table
    )
    candidates = (
        [pilot]
        if not pilot.is_dir()
        else [
            pilot / "runs.csv",
            ResultPaths.merged_tables_of(pilot)[0],
        ]
    )
    table = next((c for c in candidates if c.is_file()), None)
    if table is None:
        raise CodlError(
            f"--pilot {pilot}: no runs table ({' or '.join(map(str, candidates))}), expected "
            "the runs.csv of earlier results or of a pilot run"
        )
    out = plan_repeats(pd.read_csv(table), args.target_ci)
    if out.empty:
        raise CodlError(f"{table}: no run with its isolation twin to estimate run-to-run scatter")
    if args.json:
        print(out.to_json(orient="records", indent=2))
        return 0
    print(
        f"repeats (blocks of one run and its twin) for a 95 % interval of +/- "
        f"{args.target_ci:g} points on the mean ratio, from {table}:"
    )
    print(out.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


def _plan_registry(args: argparse.Namespace) -> int:
    """``codl plan CONFIG --freeze``: write the frozen plan, print its path and hash;
    ``--status``: pre-registered or exploratory (codl.plan_registry)."""
    from codl import plan_registry

    if args.freeze and args.status:
        raise CodlError("--freeze, --status: one at a time (freeze, commit, then run)")
    if args.freeze:
        path, frozen = plan_registry.freeze(Path(args.config))
        print(f"{frozen.sha256}  {path}")
        return 0
    st = plan_registry.status(Path(args.config), runs_tables=[Path(t) for t in args.runs])
    print(st.line())
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from codl.advisor.settings import advisor_settings
    from codl.config import block_slots, build_plan, load_yaml, plan_blocks
    from codl.paths import ResultPaths, set_name_of

    _not_a_directory(args.config, "a config file (YAML, e.g. config/smoke.yaml)")
    if args.target_ci is not None:
        return _plan_target_ci(args)
    if args.freeze or args.status:
        return _plan_registry(args)
    cfg = load_yaml(Path(args.config))
    if advisor_settings(cfg).calibrate:
        # The runs the workflow plans for it (workflow/rules/common.smk): the fit's probe.
        from codl.steps.advisor import probe_workflow_config

        cfg = probe_workflow_config(cfg, source=str(args.config))
    plan = build_plan(cfg, source=str(args.config))
    result_set = ResultPaths(set_name=set_name_of(cfg, [args.config])).set_dir
    if args.result_set:
        print(result_set)
        return 0
    blocks = plan_blocks(cfg, plan)
    slots = block_slots(blocks)
    seeds = {b.name: b.seed for b in blocks}
    # One row per distinct run: a run shared by several experiments or factor combinations (a
    # `compute` run does not depend on loader workers) is measured once and listed once.
    rows: dict[str, dict[str, Any]] = {}
    for r in plan.runs:
        row = rows.setdefault(
            r.run_id,
            {
                "experiments": [],
                "run_id": r.run_id,
                "mode": r.spec.mode.value,
                "policy": r.spec.pinning.policy.value,
                "workers": r.spec.loader.workers if r.spec.mode.loads else 0,
                "repeat": r.spec.repeat,
            },
        )
        if r.experiment not in row["experiments"]:
            row["experiments"].append(r.experiment)
        if r.run_id in slots:
            row["block"] = slots[r.run_id].block
            if seeds[row["block"]] is not None:
                row["block_seed"] = seeds[row["block"]]
    if blocks:
        # The order the runs go in: block by block, each in its planned order.
        rows = {rid: rows[rid] for b in blocks for rid in b.run_ids}
    if args.json:
        print(json.dumps(list(rows.values()), indent=2))
        return 0
    print(
        f"{len(rows)} distinct runs in {len(plan.experiments())} experiment(s); "
        f"tables, figures and report in {result_set}/"
    )
    for row in rows.values():
        cells = {**row, "experiments": ",".join(row["experiments"])}
        print("  ".join(f"{k}={v}" for k, v in cells.items()))
    return 0


def cmd_dataset(args: argparse.Namespace) -> int:
    from codl.datasets import generate
    from codl.spec import DatasetSpec, from_dict

    spec = from_dict(DatasetSpec, _json_arg(args.spec_json, "--spec-json"), where="dataset")
    manifest = generate(spec, Path(args.out))
    print(f"{args.out}: {manifest['files']} files, {manifest['bytes']} bytes")
    return 0


def _json_arg(text: str, option: str) -> Any:
    from codl.spec import loads_json

    return loads_json(text, source=option)


def cmd_write_spec(args: argparse.Namespace) -> int:
    from codl.harness.runner import write_spec_json
    from codl.spec import RunSpec

    spec = RunSpec.from_dict(_json_arg(args.spec_json, "SPEC_JSON"))
    write_spec_json(spec, Path(args.out))
    print(f"{args.out}: run {spec.run_id}")
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    from codl.datasets import stage
    from codl.outputs import check_output, same_file

    marker = Path(args.marker)
    if marker.exists():
        check_output(marker, inputs=(Path(args.manifest),), option="--marker")
    elif same_file(marker.parent, Path(args.to)) or same_file(
        marker.parent, Path(args.manifest).parent
    ):
        raise CodlError(f"--marker {marker} must not be inside the data set it marks")
    manifest = stage(Path(args.manifest).parent, Path(args.to), marker=Path(args.marker))
    print(f"staged {manifest['files']} files to {args.to}")
    return 0


def cmd_summarize(args: argparse.Namespace) -> int:
    from codl.outputs import check_outputs
    from codl.steps.analysis import summarize_to, write_calls

    _not_a_directory(args.trace, "a trace file", RunFiles(Path(args.trace)).trace.name)
    # Beside the trace by default: the run directory the workflow's summarize rule writes into.
    out = Path(args.out_dir) if args.out_dir is not None else Path(args.trace).parent
    if out.exists() and not out.is_dir():
        raise CodlError(f"--out-dir {out} exists and is not a directory")
    files = RunFiles(out)
    # The same tables, under the same names, as the workflow's summarize rule writes, as one
    # unit (summarize_to); checked here too, so that a refused output costs no time.
    tables = files.tables()
    outs = [*tables.values(), files.summarize_unit, *([files.calls] if args.calls else [])]
    if out.is_dir():
        check_outputs({f"--out-dir ({p.name})": p for p in outs}, inputs=(Path(args.trace),))
    summary = summarize_to(Path(args.trace), **tables, manifest=files.summarize_unit)
    print(summary.T.to_string())
    if args.calls:
        # A second pass, after the summary's tables are in place: a failure here loses none.
        write_calls(Path(args.trace), files.calls)
    return 0


def _add_convert(sub: Any) -> None:
    cv = sub.add_parser(
        "convert", help="copy a trace with another codec (gzip: any HDF5 tool reads it)"
    )
    cv.add_argument("trace", type=Path)
    cv.add_argument("-o", "--output", required=True, help="the copy (a new .h5 path)")
    cv.add_argument(
        "--compression",
        default="gzip",
        help="codec of the copy: gzip (default, no plugin needed), blosc-lz4 or lzf",
    )
    cv.add_argument("--allow-incomplete", action="store_true", help="copy an incomplete trace")
    cv.set_defaults(func=cmd_convert)


def _add_run_and_traces(sub: Any) -> None:
    """``run``, and the commands that read one trace: ``inspect``, ``export``."""
    r = sub.add_parser("run", help="run one spec (all its ranks) and write its trace")
    r.add_argument("spec", type=Path, help="spec.json of the run")
    r.add_argument("--trace", help="trace path (default: trace.h5 next to the spec)")
    r.add_argument("--dataset-dir", help="data set directory (modes that load data)")
    r.add_argument("--kineto-dir", help="where the raw Kineto trace goes (cupti level)")
    r.add_argument(
        "--cpus-per-task",
        type=bounded_int(0, MAX_CORES),
        default=0,
        help="CPUs per rank when a multi-rank run starts its ranks with srun (0: Slurm's default)",
    )
    r.set_defaults(func=cmd_run)

    i = sub.add_parser("inspect", help="human summary of a trace")
    i.add_argument("trace", type=Path)
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--allow-incomplete", action="store_true", help="read an incomplete trace")
    i.set_defaults(func=cmd_inspect)

    e = sub.add_parser(
        "export",
        help="Chrome/Perfetto trace JSON, or Perfetto protobuf",
        description="Write one run's trace for Perfetto (ui.perfetto.dev) or chrome://tracing. "
        "Times in the output are on the export's time axis: time since the run began (the "
        "trace's t_begin_ns, stated in the file: otherData.time_base_monotonic_ns in the JSON, "
        "the 'run begin' instant at 0 on the 'time axis' track in both formats), whatever "
        "window is exported. --from/--to take the same axis: a time read off an export, or off "
        "Perfetto's timeline, selects that instant.",
    )
    e.add_argument("trace", type=Path)
    e.add_argument("-o", "--output", required=True)
    e.add_argument(
        "--format",
        choices=("chrome-json", "perfetto-proto"),
        default="chrome-json",
        help="chrome-json (default; one JSON document, export a window of long runs) or "
        "perfetto-proto (Perfetto's protobuf, streamed: whole runs; needs codl[perfetto])",
    )
    e.add_argument(
        "--from",
        dest="start",
        type=export_time,
        metavar="TIME",
        help="window start on the export's time axis (since the run began): seconds (1.27), "
        "a number with a unit (1270ms, 1270000us: the JSON's ts, 1270000000ns) or Perfetto's "
        "timecode, quoted ('00:00:01.270 000 000'); or mono:NS, CLOCK_MONOTONIC ns as the "
        "trace's tables store them (their start_ns)",
    )
    e.add_argument(
        "--to",
        dest="end",
        type=export_time,
        metavar="TIME",
        help="window end (excluded), written as --from",
    )
    e.set_defaults(func=cmd_export)


def _add_plan(sub: Any) -> None:
    pl = sub.add_parser("plan", help="validate a config and list its runs")
    pl.add_argument("config", type=Path)
    pl.add_argument("--json", action="store_true")
    pl.add_argument(
        "--target-ci",
        type=finite_float(0.01, 1000.0),
        metavar="P",
        help="print the repeats each comparison needs for a 95 %% interval of +/- P points on "
        "its mean ratio, and their node time, from the scatter of --pilot's runs",
    )
    pl.add_argument(
        "--pilot",
        metavar="RESULTS",
        help="runs.csv, or a result set holding one, to estimate run-to-run scatter "
        "from (default: this config's own, results/<name>/tables/runs.csv)",
    )
    pl.add_argument(
        "--result-set",
        action="store_true",
        help="print the directory of the config's result set (results/<name>: its `name` key, "
        "else the file's name) and exit",
    )
    pl.add_argument(
        "--freeze",
        action="store_true",
        help="write the plan (runs, blocks, hypothesis, the advisor's predictions) and its "
        "sha256 to results/<name>/plan.frozen.json; print the hash and the path",
    )
    pl.add_argument(
        "--status",
        action="store_true",
        help="print whether the result is pre-registered (its frozen plan committed to git "
        "before its first run) or exploratory, and whether blocks were added after looking",
    )
    pl.add_argument(
        "--runs",
        action="append",
        default=[],
        metavar="RUNS_CSV",
        help="with --status: a runs table of the result (repeatable; default: "
        "results/<name>/tables/runs.csv)",
    )
    pl.set_defaults(func=cmd_plan)


def _add_levels(sub: Any) -> None:
    lv = sub.add_parser(
        "levels",
        help="pool block experiments of several invocations with the invocation as a level",
    )
    lv.add_argument(
        "tables",
        nargs="+",
        type=Path,
        metavar="POOLED_RUNS_CSV",
        help="one pooled runs table per invocation (pooled_runs.csv or gil_runs.csv); the "
        "invocation is named by its directory (above tables/)",
    )
    lv.add_argument("--out", type=Path, required=True, help="the table to write (CSV)")
    lv.set_defaults(func=cmd_levels)


def cmd_levels(args: argparse.Namespace) -> int:
    from codl.steps.levels import levels_to

    table = levels_to(list(args.tables), args.out)
    print(f"{args.out}: {len(table)} rows ({table['method'].nunique()} methods per setting)")
    return 0


def _add_regenerate(sub: Any) -> None:
    rg = sub.add_parser(
        "regenerate",
        help="rebuild every committed result set's tables and figures from what it commits, "
        "through the rules' functions, and compare them with the committed files",
    )
    rg.add_argument(
        "sets",
        nargs="*",
        metavar="SET",
        help="result sets to rebuild, relative to --results (each with its sub-sets; "
        "default: every set)",
    )
    rg.add_argument(
        "--results", type=Path, default=Path("results"), help="where the sets are (results)"
    )
    rg.add_argument(
        "--write",
        action="store_true",
        help="replace the committed files with the rebuilt ones (as one unit per set), then "
        "compare; without it nothing is written",
    )
    rg.set_defaults(func=cmd_regenerate)


def cmd_regenerate(args: argparse.Namespace) -> int:
    from codl.steps.regenerate import Status, exit_code, regenerate

    if not args.results.is_dir():
        raise CodlError(f"--results: {args.results} is not a directory of result sets")
    try:
        verdicts = regenerate(args.results, sets=args.sets, write=args.write)
    except ValueError as exc:
        raise CodlError(str(exc)) from None
    counts = {s: sum(v.status is s for v in verdicts) for s in Status}
    print(
        f"{len(verdicts)} sets: {counts[Status.OK]} ok, {counts[Status.DIFFERS]} differ, "
        f"{counts[Status.CANNOT]} cannot be rebuilt (their traces are not committed)"
    )
    return exit_code(verdicts)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="codl", description=__doc__)
    p.add_argument("--version", action="version", version=f"codl {__version__}")
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LEVELS,
        help="log messages at this level and above on stderr (default: $CODL_LOG_LEVEL or INFO)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    _add_run_and_traces(sub)
    _add_convert(sub)

    _add_plan(sub)
    _add_levels(sub)
    _add_regenerate(sub)

    d = sub.add_parser("dataset", help="generate a data set from its spec")
    d.add_argument("--spec-json", required=True, help="DatasetSpec as JSON")
    d.add_argument("--out", required=True)
    d.set_defaults(func=cmd_dataset)

    ws = sub.add_parser("write-spec", help="validate a spec (JSON) and write it as spec.json")
    ws.add_argument("spec_json")
    ws.add_argument("--out", required=True)
    ws.set_defaults(func=cmd_write_spec)

    sg = sub.add_parser("stage", help="copy a generated data set to a storage tier")
    sg.add_argument("manifest", help="MANIFEST.json of the generated data set")
    sg.add_argument("--to", required=True, help="target directory on the tier")
    sg.add_argument("--marker", required=True, help="marker file written when the copy is done")
    sg.set_defaults(func=cmd_stage)

    s = sub.add_parser("summarize", help="per-step and per-run tables of one trace")
    s.add_argument("trace", type=Path)
    s.add_argument(
        "--out-dir",
        help="directory for the tables (default: the trace's own directory, where the "
        "workflow's summarize rule writes them)",
    )
    s.add_argument(
        "--calls",
        action="store_true",
        help="also write calls.parquet: every CUDA runtime API call, a row each (it grows with "
        "the calls: ~0.4 GB for 7 x 10^7 calls)",
    )
    s.set_defaults(func=cmd_summarize)
    claims_cli.add_parser(sub)
    makespan_cli.add_parser(sub)

    # Its own parser (codl.cli.advise), handed the rest of the line: importing it here would
    # load pandas for every `codl run`, whose start-up is part of the measured job.
    a = sub.add_parser(
        "advise",
        add_help=False,
        help="fit the throughput model on a results directory, advise loader workers and policy",
    )
    a.add_argument("args", nargs=argparse.REMAINDER, help="see `codl advise --help`")
    # Handed over as `advise` is (codl.cli.check), for the same reason.
    c = sub.add_parser(
        "check",
        add_help=False,
        help="the advisor's out-of-sample checks: predict, score, holdout, splits, share, "
        "uncalibrated, blind, calibration, runlevel",
    )
    c.add_argument("args", nargs=argparse.REMAINDER, help="see `codl check --help`")
    return p


#: Subcommands with parsers of their own, handed the rest of the line (see build_parser).
_HANDED_OVER = ("advise", "check")


def _advise_split(argv: list[str]) -> int | None:
    """Where ``advise`` stands in ``argv`` when it is the subcommand (after global options
    only), else None."""
    i = 0
    while i < len(argv):
        if argv[i] in _HANDED_OVER:
            return i
        if argv[i] == "--log-level":
            i += 2
        elif argv[i].startswith("--log-level="):
            i += 1
        else:
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    at = _advise_split(argv)
    if at is not None:
        # Handed over whole (its options, --help included), imported only now: see build_parser.
        # The global options before it are this parser's (`codl --log-level DEBUG advise R`).
        glob = build_parser().parse_args([*argv[:at], argv[at]])
        try:
            configure(glob.log_level)
        except CodlError as exc:
            print(f"codl {argv[at]}: error: {exc}", file=sys.stderr)
            return 2
        one_blas_thread()
        if argv[at] == "check":
            from codl.cli import check

            return check.main(argv[at + 1 :])
        from codl.cli import advise

        return advise.main(argv[at + 1 :])
    args = build_parser().parse_args(argv)
    if args.command != "run":  # its ranks' torch may compute on OpenBLAS (codl.blas)
        one_blas_thread()
    try:
        configure(args.log_level)
        return int(args.func(args))
    except CodlError as exc:
        print(f"codl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `codl plan CONFIG | head`: the reader left. Python would complain again when it flushes
        # stdout at exit, so stdout goes to /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell tool killed by the signal reports
    except OSError as exc:
        # A file the user named cannot be read or written (permissions, a full disk): their
        # environment, not a codl bug, so one line; the traceback at --log-level DEBUG.
        log.debug("codl %s failed", args.command, exc_info=True)
        print(f"codl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C outside a run (a run turns SIGINT into RunInterruptedError itself).
        print(f"codl {args.command}: interrupted (SIGINT)", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
