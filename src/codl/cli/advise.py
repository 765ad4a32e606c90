"""``codl advise RESULTS_DIR [--cores N] [--out verify.yaml] [--cross-validate CSV]
[--probe-out probe.yaml] [--calibrate PROBE_RESULTS [--probe-config probe.yaml]
[--calibration-table CSV]] [--text advice.txt]``.

RESULTS_DIR holds the merged tables as the workflow writes them (``tables/runs.csv``,
``tables/steps.csv.gz``) and, when the workflow made it, the ``config.yaml`` the runs came from
(its ``defaults`` and ``slurm.cpus_per_rank`` are reused). Exit 0, or 2 with a one-line error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

import codl
from codl.advisor import model as mdl
from codl.advisor.advise import (
    Advice,
    Prefer,
    advise,
    best_measured,
    defaults_from_runs,
    efficiency_lines,
    predicted_gain,
    render_config,
    snakemake_command,
    verification_config,
    verify_lines,
)
from codl.advisor.calibrate import Calibration, calibrate, probe_config
from codl.cli.options import (
    MAX_BOOT_SEED,
    MAX_CORES,
    MAX_REPEATS,
    MAX_REPLICATES,
    MAX_STEPS,
    Parser,
    bounded_int,
    finite_float,
)
from codl.config import build_plan, load_checked
from codl.errors import CodlError, ConfigError
from codl.outputs import OutputUnit, output_unit
from codl.paths import ResultPaths
from codl.spec import Handoff
from codl.steps.advisor import (
    CONFIG_NAME,
    FittedResults,
    advice_record,
    check_results,
    config_cores,
    fit_results,
    located,
    read_table,
    record_predictions,
    source_config,
)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="codl advise",
        description="Fit the throughput model on a results directory and advise loader workers, "
        "CPU-set policy and launch cores per rank; write a verification config.",
    )
    p.add_argument("results", type=Path, help="results directory with tables/runs.csv")
    cores = bounded_int(1, MAX_CORES)
    p.add_argument("--cores", type=cores, help="core budget per rank (default: the measured one)")
    p.add_argument(
        "--fit-cores",
        type=cores,
        help="cores per rank of the runs whose runs.csv row has no `cpus` (summarized before "
        "the column; default: slurm.cpus_per_rank of RESULTS/config.yaml, else the most common "
        "`cpus` of runs.csv)",
    )
    p.add_argument("--out", type=Path, help="write the verification config here")
    p.add_argument(
        "--mode",
        choices=mdl.COMBINED_MODES,
        help="the combined mode to fit when the tables hold both",
    )
    p.add_argument(
        "--handoff",
        choices=[h.value for h in Handoff],
        help="fit the runs of this loader.handoff (default: the one whose best measured setting "
        "is fastest, when the tables hold several)",
    )
    p.add_argument(
        "--max-workers",
        type=bounded_int(1, 2 * MAX_CORES),
        help="largest worker count tried (default 2 x cores)",
    )
    p.add_argument(
        "--worker-step",
        type=bounded_int(1, MAX_CORES),
        default=2,
        help="neighbours: workers +- this",
    )
    p.add_argument(
        "--repeats",
        type=bounded_int(1, MAX_REPEATS),
        default=3,
        help="repeats of each verification run",
    )
    p.add_argument(
        "--steps",
        type=bounded_int(1, MAX_STEPS),
        help="measured steps of the verification runs (default: as measured)",
    )
    p.add_argument(
        "--tie",
        type=finite_float(0, 1),
        default=0.01,
        help="relative tie tolerance (see --prefer)",
    )
    p.add_argument(
        "--prefer",
        type=Prefer,
        choices=list(Prefer),
        default=Prefer.HEADROOM,
        help="which setting wins among those within --tie of the best: headroom (fewest launch "
        "CPUs, then workers up to the loader's cores; default) or fewest-cores",
    )
    p.add_argument(
        "--cross-validate",
        type=Path,
        metavar="CSV",
        help="also refit without each combined worker count in turn, predict it, print the "
        "out-of-sample error and write it here",
    )
    p.add_argument(
        "--boot",
        type=bounded_int(0, MAX_REPLICATES),
        default=200,
        help="bootstrap replicates (0: none, and no intervals are shown)",
    )
    p.add_argument("--seed", type=bounded_int(0, MAX_BOOT_SEED), default=0)
    _calibration_options(p)
    return p


def _calibration_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--predictions",
        type=Path,
        metavar="CSV",
        help="with --out: write the model's prediction for every setting of the verification "
        "config here and record its path, sha256 and time in the config (advisor.predictions), "
        "so the verification runs compare with it and prove it came first",
    )
    p.add_argument(
        "--calibrate",
        type=Path,
        metavar="PROBE_RESULTS",
        help="re-fit the machine's parameters (loader and launch CPU speed, compute per policy) "
        "on a probe's results directory measured on the new machine, keep the rest, and advise "
        "with the calibrated model",
    )
    p.add_argument(
        "--probe-config",
        type=Path,
        metavar="PROBE.yaml",
        help="with --calibrate: calibrate on this probe config's runs only, each of which "
        "PROBE_RESULTS must hold (the config --probe-out wrote)",
    )
    p.add_argument(
        "--calibration-table",
        type=Path,
        metavar="CSV",
        help="with --calibrate: write the probe's table here (per probe configuration: "
        "measured, predicted before and after the calibration, their errors)",
    )
    p.add_argument(
        "--details",
        action="store_true",
        help="also print the model behind the advice: its parameters with their intervals, the "
        "advised setting's operating point, the best setting per policy, the fit's notes (and "
        "with --calibrate the probe's table)",
    )
    p.add_argument(
        "--text",
        type=Path,
        metavar="FILE",
        help="also write the advice here, with its details whether or not --details is given: "
        "the file is the advice's record, as the workflow's advice.txt is",
    )
    p.add_argument(
        "--probe-out",
        type=Path,
        metavar="PROBE.yaml",
        help="write the probe config for a new machine: the three runs that tell the model the "
        "most about it (docs/advisor.md, 'Calibration on a new machine')",
    )


def main(argv: list[str] | None = None) -> int:
    """``codl advise RESULTS_DIR [--cores N] [--out verify.yaml]``: 0, or 2 with a one-line
    error on stderr."""
    return run(build_parser().parse_args(argv))


def _verify_command(config: Path | None) -> str:
    """The command that runs the verification config (``config``, else the ``verify.yaml``
    the hint asks for) as the user types it here: Snakemake runs from the checkout's root,
    where ``profiles/local`` is; from elsewhere the command goes there first."""
    target = config if config is not None else Path("verify.yaml")
    if Path("profiles", "local").is_dir():
        return snakemake_command(target)
    checkout = Path(codl.__file__).resolve().parents[2]
    if (checkout / "profiles" / "local").is_dir():
        return f"cd {shlex.quote(str(checkout))} && {snakemake_command(target.absolute())}"
    return snakemake_command(target.absolute())


def _write_verification(
    args: argparse.Namespace,
    advice: Advice,
    fitted: FittedResults,
    fit: mdl.Fit,
    unit: OutputUnit,
) -> None:
    source_cfg = fitted.source_cfg
    defaults = source_cfg.get("defaults") or defaults_from_runs(fitted.runs, fit.node.combined_mode)
    cfg = verification_config(
        advice,
        fit,
        defaults=defaults,
        slurm=source_cfg.get("slurm"),
        worker_step=args.worker_step,
        repeats=args.repeats,
        measured_steps=args.steps,
        best=best_measured(fitted.data),
    )
    try:
        build_plan(cfg, source=str(args.out))
    except ConfigError as exc:
        # The defaults come from the results' config, which may predate today's schema.
        raise CodlError(f"verification config invalid: {exc.one_line()}") from None
    if args.predictions is not None:
        record_predictions(cfg, fit, advice, args.predictions, unit.path(args.predictions))
    unit.path(args.out).write_text(render_config(cfg, advice, str(args.results)))


def _cross_validate(
    args: argparse.Namespace, fitted: FittedResults, fit: mdl.Fit, unit: OutputUnit
) -> str:
    """The in- and out-of-sample errors, as lines; the held-out table written."""
    inside = mdl.check(fit, fitted.data)["error"].abs()
    lines = [
        f"in sample (the {len(inside)} combined runs fitted on): |error| median "
        f"{100 * inside.median():.1f} %, worst {100 * inside.max():.1f} %"
    ]
    cv = mdl.cross_validate(
        fitted.runs, fitted.steps, cores=fit.cores, combined_mode=fit.node.combined_mode
    )
    cv.to_csv(unit.path(args.cross_validate), index=False)
    err = cv["error"].abs().dropna()
    counts = ", ".join(str(w) for w in sorted(cv["held_workers"].unique()))
    lines.append(
        f"out of sample (each combined worker count held out in turn: {counts}): "
        f"|error| median {100 * err.median():.1f} %, worst {100 * err.max():.1f} % over "
        f"{len(err)} runs; mean error {100 * cv['error'].mean():+.1f} % "
        f"({args.cross_validate})"
    )
    lines += [f"note: a fold was not fitted: {n}" for n in sorted(set(cv["note"]) - {""})]
    return "\n" + "\n".join(lines) + "\n"


def _probe_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--probe-config``, checked as a config (None without the option)."""
    path: Path | None = args.probe_config
    if path is None:
        return None
    what = "the probe config that `codl advise RESULTS --probe-out PROBE.yaml` wrote"
    if not path.exists():
        raise CodlError(f"--probe-config {path}: no such file, expected {what}")
    if not path.is_file():
        raise CodlError(f"--probe-config {path}: not a regular file, expected {what}")
    try:
        return load_checked(path)
    except CodlError as exc:
        raise CodlError(f"--probe-config {exc}; expected {what}") from None


def _probe_runs(
    args: argparse.Namespace, runs: pd.DataFrame, cfg: Mapping[str, Any]
) -> pd.DataFrame:
    """``runs`` (PROBE_RESULTS' table) cut to the runs of ``--probe-config`` (``cfg``), each of
    which must be there."""
    planned = list(build_plan(cfg, source=str(args.probe_config)).specs)
    measured = set(runs["run_id"].astype(str))
    missing = [r for r in planned if r not in measured]
    if missing:
        raise CodlError(
            f"--calibrate {args.calibrate}: run(s) {', '.join(missing)} of --probe-config "
            f"{args.probe_config} not in its runs.csv: run the probe config there first"
        )
    return runs[runs["run_id"].astype(str).isin(planned)]


def _check_probe_results(probe: Path) -> None:
    try:
        check_results(probe)
    except CodlError as exc:
        raise CodlError(f"--calibrate {exc}") from None


def _calibrate(
    args: argparse.Namespace, fit: mdl.Fit, unit: OutputUnit, cfg: Mapping[str, Any] | None
) -> tuple[Calibration, str]:
    """The fit calibrated on the probe in ``args.calibrate`` (``cfg``: its ``--probe-config``)
    and the probe's table as text (written to ``--calibration-table``)."""
    probe: Path = args.calibrate
    runs_csv, steps_csv = ResultPaths.merged_tables_of(probe)
    missing = f"missing table (--calibrate {probe} must hold the probe's tables/)"
    runs, steps = read_table(runs_csv, missing=missing), read_table(steps_csv, missing=missing)
    # The probe's core budget: its config's (the one given, else the one beside its tables).
    cores = config_cores(
        cfg if cfg is not None else source_config(probe), args.probe_config or probe / CONFIG_NAME
    )
    try:
        mdl.check_tables(runs, steps, runs_name=str(runs_csv), steps_name=str(steps_csv))
        if cfg is not None:
            runs = _probe_runs(args, runs, cfg)
        data = mdl.run_data(
            runs, steps[steps["run_id"].isin(runs["run_id"])], combined_mode=fit.node.combined_mode
        )
        c = calibrate(fit, data, cores=int(cores or args.cores or fit.cores))
    except mdl.ModelError as exc:
        raise located(exc, runs=runs_csv, steps=steps_csv) from None
    if args.calibration_table is not None:
        c.table.to_csv(unit.path(args.calibration_table), index=False, float_format="%.6g")
    cols = ["mode", "policy", "workers", "cores", "measured", "before", "after"]
    table = c.table[cols].to_string(index=False, float_format=lambda v: f"{v:.0f}")
    return c, f"calibration on {probe} (per probe configuration, samples/s per rank):\n{table}\n\n"


def _calibrated_note(probe: Path, c: Calibration) -> str:
    compute = ", ".join(f"{v:.2f}x under {p}" for p, v in sorted(c.compute_factor.items()))
    return (
        f"the model is calibrated on the probe in {probe}: that machine's CPUs run the loader "
        f"{c.cpu_factor:.2f}x as fast as the fitted runs' machine, its compute {compute}"
    )


def _write_probe(
    args: argparse.Namespace,
    advice: Advice,
    fit: mdl.Fit,
    fitted: FittedResults,
    unit: OutputUnit,
) -> None:
    source_cfg = fitted.source_cfg
    defaults = source_cfg.get("defaults") or defaults_from_runs(fitted.runs, fit.node.combined_mode)
    cfg = probe_config(
        fit, advice, defaults=defaults, slurm=source_cfg.get("slurm"), measured_steps=args.steps
    )
    try:
        build_plan(cfg, source=str(args.probe_out))
    except ConfigError as exc:
        raise CodlError(f"probe config invalid: {exc.one_line()}") from None
    header = (
        f"# Probe of a new machine for `codl advise {args.results}` (docs/advisor.md,\n"
        "# 'Calibration on a new machine'): run it there, then\n"
        f"# `codl advise {args.results} --calibrate PROBE_RESULTS`.\n"
    )
    unit.path(args.probe_out).write_text(
        header + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None)
    )


def _probe_lines(args: argparse.Namespace) -> list[str]:
    """What to do with the probe config ``--probe-out`` wrote."""
    if args.probe_out is None:
        return []
    results = shlex.quote(str(args.results))
    probe = shlex.quote(str(args.probe_out))
    return [
        "",
        f"to calibrate on a new machine: run the probe config {args.probe_out} there (three "
        "runs), then advise from the results directory they write (PROBE_RESULTS):",
        f"  {_verify_command(args.probe_out)}",
        f"  codl advise {results} --calibrate PROBE_RESULTS --probe-config {probe}",
    ]


def _outputs(args: argparse.Namespace) -> dict[str, Path]:
    named = {
        "--out": args.out,
        "--cross-validate": args.cross_validate,
        "--probe-out": args.probe_out,
        "--predictions": args.predictions,
        "--calibration-table": args.calibration_table,
        "--text": args.text,
    }
    return {option: path for option, path in named.items() if path is not None}


def _inputs(
    results: Path, probe: Path | None = None, probe_config: Path | None = None
) -> tuple[Path, ...]:
    """What advise reads: no output may be one of them (``--out runs.csv`` would replace it)."""
    dirs = (results,) if probe is None else (results, probe)
    read = tuple(p for d in dirs for p in (*ResultPaths.merged_tables_of(d), d / CONFIG_NAME))
    return read if probe_config is None else (*read, probe_config)


def _check_options(args: argparse.Namespace) -> None:
    if args.predictions is not None and args.out is None:
        raise CodlError("--predictions needs --out: it predicts the verification config")
    for option in ("probe_config", "calibration_table"):
        if getattr(args, option) is not None and args.calibrate is None:
            raise CodlError(f"--{option.replace('_', '-')} needs --calibrate")
    if args.cross_validate is not None and args.calibrate is not None:
        raise CodlError(
            "--cross-validate with --calibrate: the held-out runs are the fit's machine's, "
            "the calibrated model another's; run them apart"
        )


_NOT_REGULAR = {
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a pipe",
    stat.S_IFSOCK: "a socket",
}


def _check_regular(outputs: Mapping[str, Path]) -> None:
    """Every output is a regular file or a new path. A config or table written to /dev/null
    or a pipe is gone when the command says it wrote it (and a predictions file read back
    for its sha256 there would hash nothing), so the stream outputs other commands allow are
    refused here."""
    for option, path in outputs.items():
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):
            kind = _NOT_REGULAR.get(stat.S_IFMT(mode), "not a regular file")
            raise CodlError(
                f"{option} {path}: is {kind}, expected the path of a regular file to write "
                "(a new one or one to replace)"
            )


@contextlib.contextmanager
def _new_dirs(paths: Iterable[Path]) -> Iterator[None]:
    """The outputs' missing directories, created for the write and removed again (those still
    empty) when the command fails: a refused command leaves nothing behind."""
    made: list[Path] = []
    for path in paths:
        missing = [d for d in (Path(path).parent, *Path(path).parent.parents) if not d.exists()]
        for d in reversed(missing):
            d.mkdir()
            made.append(d)
    try:
        yield
    except BaseException:
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def run(args: argparse.Namespace) -> int:
    """The command on parsed arguments, so that ``cli.py`` can mount ``build_parser()`` as a
    parent of its ``advise`` subcommand and dispatch here."""
    try:
        # One unit: the verification config, the probe, the tables and the text appear
        # together or not at all, checked (and locked) before the fit, so a refused output
        # costs no time; what is printed is printed once they are in place.
        _check_options(args)
        outputs = _outputs(args)
        _check_regular(outputs)
        # The inputs a glance can refuse, before anything is created or fitted.
        check_results(args.results)
        if args.calibrate is not None:
            _check_probe_results(args.calibrate)
        probe_cfg = _probe_config(args)
        inputs = _inputs(args.results, args.calibrate, args.probe_config)
        with _new_dirs(outputs.values()), output_unit(outputs, inputs=inputs) as unit:
            shown, record = _advise(args, unit, probe_cfg)
            if args.text is not None:
                unit.path(args.text).write_text(record)
    except CodlError as exc:
        print(f"codl advise: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A file the user named cannot be read or written (permissions, a full disk).
        print(f"codl advise: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(shown)
    return 0


def _advise(
    args: argparse.Namespace, unit: OutputUnit, probe_cfg: Mapping[str, Any] | None
) -> tuple[str, str]:
    """Fit (and calibrate on the probe, ``probe_cfg`` its ``--probe-config``), advise, and
    write the unit's members; what to print and what the advice's record (``--text``)
    holds."""
    fitted = fit_results(
        args.results,
        fit_cores=args.fit_cores,
        mode=args.mode,
        boot=args.boot,
        seed=args.seed,
        handoff=args.handoff,
    )
    fit, probe_table = fitted.fit, ""
    notes: list[str] = []
    if args.calibrate is not None:
        c, probe_table = _calibrate(args, fit, unit, probe_cfg)
        fit = c.fit
        notes.append(_calibrated_note(args.calibrate, c))
    # As the workflow's advise rule says it: the measured efficiency of the best setting.
    best = best_measured(fitted.data)
    notes += efficiency_lines(fitted.runs, best, mode=fit.node.combined_mode)
    cores = args.cores if args.cores is not None else fit.cores
    advice = advise(
        fit,
        cores=cores,
        max_workers=args.max_workers,
        tie=args.tie,
        prefer=args.prefer,
        handoff=fitted.handoff,
    )
    if args.out is not None:
        _write_verification(args, advice, fitted, fit, unit)
    if args.probe_out is not None:
        _write_probe(args, advice, fit, fitted, unit)
    cv = _cross_validate(args, fitted, fit, unit) if args.cross_validate is not None else ""
    verify = verify_lines(
        args.out,
        command=_verify_command(args.out),
        repeats=args.repeats,
        predictions=args.predictions,
    )
    text: dict[str, Any] = {
        "advice": advice,
        "fit": fit,
        "gain": predicted_gain(fit, advice, best),
        "verify": [*verify, *_probe_lines(args)],
        "prefer": args.prefer,
        "tie": args.tie,
        "notes": notes,
        "between": cv,
        "before_details": probe_table,
    }
    record = advice_record(**text)
    shown = record if args.details else advice_record(**text, details=False)
    return shown, record


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
