"""`codl` command line: run | inspect | export | plan | dataset | write-spec | stage | summarize |
advise."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from codl import __version__
from codl.errors import CodlError
from codl.log import LEVELS, configure
from codl.paths import RunFiles

log = logging.getLogger(__name__)


def _load_spec(path: Path) -> Any:
    from codl.spec import RunSpec

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CodlError(f"{path}: no such spec file") from None
    except json.JSONDecodeError as exc:
        raise CodlError(f"{path}: not valid JSON ({exc})") from None
    return RunSpec.from_dict(data)


_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def _same_file(a: Path, b: Path) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links to one inode
    except OSError:
        return False


def _is_hdf5(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(8) == _HDF5_MAGIC
    except OSError:
        return False


def check_output(output: Path, *, inputs: tuple[Path, ...], option: str) -> None:
    """Refuse an output path that is one of the inputs, a directory, in a missing directory, or
    an existing HDF5 file (a measurement, which no command of codl writes over as a by-product).
    """
    for inp in inputs:
        if _same_file(output, inp):
            raise CodlError(f"{option} {output} is the input {inp}; it would be overwritten")
    if output.is_dir():
        raise CodlError(f"{option} {output} is a directory, expected a file path")
    if not output.parent.is_dir():
        raise CodlError(f"{option} {output}: directory {output.parent} does not exist")
    if _is_hdf5(output):
        raise CodlError(
            f"{option} {output} exists and is an HDF5 file (a trace?); refusing to overwrite it"
        )


def _check_run_args(args: argparse.Namespace, spec: Any) -> Path:
    """Everything ``codl run`` can check before it imports torch and starts measuring."""
    from codl.datasets import check_dataset
    from codl.trace.store import check_trace_target

    trace = Path(args.trace) if args.trace else RunFiles(Path(args.spec).parent).trace
    if _same_file(trace, Path(args.spec)):
        raise CodlError(f"--trace {trace} is the spec file; it would be overwritten")
    if args.cpus_per_task < 0:
        raise CodlError(f"--cpus-per-task: got {args.cpus_per_task}, expected >= 0")
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

    launch(
        spec,
        trace_path=trace,
        dataset_dir=Path(args.dataset_dir) if args.dataset_dir else None,
        kineto_dir=Path(args.kineto_dir) if args.kineto_dir else RunFiles(trace.parent).kineto,
        argv=[sys.executable, "-m", "codl.cli", *sys.argv[1:]],
        cpus_per_task=args.cpus_per_task,
    )
    log.info("run %s: wrote %s in %.1f s", spec.run_id, trace, time.monotonic() - t0)
    print(trace)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from codl.analysis.inspect import describe, render

    info = describe(Path(args.trace), allow_incomplete=args.allow_incomplete)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True, default=str))
    else:
        print(render(info))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from codl.trace.export import export_chrome

    check_output(Path(args.output), inputs=(Path(args.trace),), option="-o/--output")
    export_chrome(Path(args.trace), Path(args.output), from_s=args.from_s, to_s=args.to_s)
    print(args.output)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from codl.config import load_plan

    plan = load_plan(Path(args.config))
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
    if args.json:
        print(json.dumps(list(rows.values()), indent=2))
        return 0
    print(f"{len(rows)} distinct runs in {len(plan.experiments())} experiment(s)")
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
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CodlError(f"{option}: not valid JSON ({exc})") from None


def cmd_write_spec(args: argparse.Namespace) -> int:
    from codl.harness.runner import write_spec_json
    from codl.spec import RunSpec

    spec = RunSpec.from_dict(_json_arg(args.spec_json, "SPEC_JSON"))
    write_spec_json(spec, Path(args.out))
    print(f"{args.out}: run {spec.run_id}")
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    from codl.datasets import stage

    marker = Path(args.marker)
    if marker.exists():
        check_output(marker, inputs=(Path(args.manifest),), option="--marker")
    elif _same_file(marker.parent, Path(args.to)) or _same_file(
        marker.parent, Path(args.manifest).parent
    ):
        raise CodlError(f"--marker {marker} must not be inside the data set it marks")
    manifest = stage(Path(args.manifest).parent, Path(args.to), marker=Path(args.marker))
    print(f"staged {manifest['files']} files to {args.to}")
    return 0


def cmd_summarize(args: argparse.Namespace) -> int:
    from codl.steps.analysis import summarize_to

    out = Path(args.out_dir)
    files = RunFiles(out)
    # The same tables, under the same names, as the workflow's summarize rule writes.
    tables = files.tables()
    for path in tables.values():
        if path.exists() or out.is_dir():
            check_output(path, inputs=(Path(args.trace),), option="--out-dir")
    summary = summarize_to(Path(args.trace), **tables)
    print(summary.T.to_string())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="codl", description=__doc__)
    p.add_argument("--version", action="version", version=f"codl {__version__}")
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LEVELS,
        help="log messages at this level and above on stderr (default: $CODL_LOG_LEVEL or INFO)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run one spec (all its ranks) and write its trace")
    r.add_argument("spec", type=Path, help="spec.json of the run")
    r.add_argument("--trace", help="trace path (default: trace.h5 next to the spec)")
    r.add_argument("--dataset-dir", help="data set directory (modes that load data)")
    r.add_argument("--kineto-dir", help="where the raw Kineto trace goes (cupti level)")
    r.add_argument(
        "--cpus-per-task",
        type=int,
        default=0,
        help="CPUs per rank when a multi-rank run starts its ranks with srun (0: Slurm's default)",
    )
    r.set_defaults(func=cmd_run)

    i = sub.add_parser("inspect", help="human summary of a trace")
    i.add_argument("trace", type=Path)
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--allow-incomplete", action="store_true", help="read an incomplete trace")
    i.set_defaults(func=cmd_inspect)

    e = sub.add_parser("export", help="Chrome/Perfetto trace JSON")
    e.add_argument("trace", type=Path)
    e.add_argument("-o", "--output", required=True)
    e.add_argument(
        "--from", dest="from_s", type=float, help="window start, seconds since the run began"
    )
    e.add_argument("--to", dest="to_s", type=float, help="window end, seconds since the run began")
    e.set_defaults(func=cmd_export)

    pl = sub.add_parser("plan", help="validate a config and list its runs")
    pl.add_argument("config", type=Path)
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(func=cmd_plan)

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
    s.add_argument("--out-dir", required=True)
    s.set_defaults(func=cmd_summarize)

    # Its own parser (codl.cli.advise), handed the rest of the line: importing it here would
    # load pandas for every `codl run`, whose start-up is part of the measured job.
    a = sub.add_parser(
        "advise",
        add_help=False,
        help="fit the throughput model on a results directory, advise loader workers and policy",
    )
    a.add_argument("args", nargs=argparse.REMAINDER, help="see `codl advise --help`")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["advise"]:
        # Handed over whole (its options, --help included), imported only now: see build_parser.
        from codl.cli import advise

        return advise.main(argv[1:])
    args = build_parser().parse_args(argv)
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
