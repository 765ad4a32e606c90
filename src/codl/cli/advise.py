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
import io
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from codl.advisor import model as mdl
from codl.advisor.advise import (
    Advice,
    Prefer,
    advise,
    best_measured,
    defaults_from_runs,
    print_advice,
    render_config,
    verification_config,
)
from codl.advisor.calibrate import calibrate, probe_config
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
from codl.config import build_plan, load_yaml
from codl.errors import CodlError, ConfigError
from codl.outputs import OutputUnit, output_unit
from codl.paths import ResultPaths
from codl.spec import Handoff
from codl.steps.advisor import CONFIG_NAME, fit_results, record_predictions


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
        "--text",
        type=Path,
        metavar="FILE",
        help="also write what the command prints (the calibration's table, the advice) here",
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


def _write_verification(
    args: argparse.Namespace,
    advice: Advice,
    fit: mdl.Fit,
    runs: pd.DataFrame,
    data: mdl.RunData,
    source_cfg: Mapping[str, Any],
    unit: OutputUnit,
) -> None:
    defaults = source_cfg.get("defaults") or defaults_from_runs(runs, fit.node.combined_mode)
    cfg = verification_config(
        advice,
        fit,
        defaults=defaults,
        slurm=source_cfg.get("slurm"),
        worker_step=args.worker_step,
        repeats=args.repeats,
        measured_steps=args.steps,
        best=best_measured(data),
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
    args: argparse.Namespace,
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    fit: mdl.Fit,
    data: mdl.RunData,
    unit: OutputUnit,
) -> None:
    inside = mdl.check(fit, data)["error"].abs()
    print(
        f"\nin sample (the {len(inside)} combined runs fitted on): |error| median "
        f"{100 * inside.median():.1f} %, worst {100 * inside.max():.1f} %"
    )
    cv = mdl.cross_validate(runs, steps, cores=fit.cores, combined_mode=fit.node.combined_mode)
    cv.to_csv(unit.path(args.cross_validate), index=False)
    err = cv["error"].abs().dropna()
    counts = ", ".join(str(w) for w in sorted(cv["held_workers"].unique()))
    print(
        f"out of sample (each combined worker count held out in turn: {counts}): "
        f"|error| median {100 * err.median():.1f} %, worst {100 * err.max():.1f} % over "
        f"{len(err)} runs; mean error {100 * cv['error'].mean():+.1f} % "
        f"({args.cross_validate})"
    )
    for note in sorted(set(cv["note"]) - {""}):
        print(f"note: a fold was not fitted: {note}")


def _probe_runs(args: argparse.Namespace, runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (PROBE_RESULTS' table) cut to the runs of ``--probe-config``, each of which
    must be there; all of them without the option."""
    if args.probe_config is None:
        return runs
    try:
        planned = list(
            build_plan(load_yaml(args.probe_config), source=str(args.probe_config)).specs
        )
    except ConfigError as exc:
        raise CodlError(f"--probe-config: {exc.one_line()}") from None
    measured = set(runs["run_id"].astype(str))
    missing = [r for r in planned if r not in measured]
    if missing:
        raise CodlError(
            f"--calibrate {args.calibrate}: run(s) {', '.join(missing)} of --probe-config "
            f"{args.probe_config} not in its runs.csv: run the probe config there first"
        )
    return runs[runs["run_id"].astype(str).isin(planned)]


def _calibrate(args: argparse.Namespace, fit: mdl.Fit, unit: OutputUnit) -> mdl.Fit:
    """The fit calibrated on the probe in ``args.calibrate``, its probe table printed (and
    written to ``--calibration-table``)."""
    probe: Path = args.calibrate
    runs_csv, steps_csv = ResultPaths.merged_tables_of(probe)
    for path in (runs_csv, steps_csv):
        if not path.is_file():
            raise CodlError(f"--calibrate {probe}: missing table {path}")
    runs = _probe_runs(args, pd.read_csv(runs_csv))
    steps = pd.read_csv(steps_csv)
    data = mdl.run_data(
        runs, steps[steps["run_id"].isin(runs["run_id"])], combined_mode=fit.node.combined_mode
    )
    # The probe's core budget: its config's (the one given, else the one beside its tables).
    cfg_path = args.probe_config or probe / CONFIG_NAME
    cfg = load_yaml(cfg_path) if cfg_path.is_file() else {}
    cores = (cfg.get("slurm") or {}).get("cpus_per_rank") or args.cores or fit.cores
    c = calibrate(fit, data, cores=int(cores))
    print(f"calibration on {probe} (per probe configuration, samples/s per rank):")
    cols = ["mode", "policy", "workers", "cores", "measured", "before", "after"]
    print(c.table[cols].to_string(index=False, float_format=lambda v: f"{v:.0f}"))
    print()
    if args.calibration_table is not None:
        c.table.to_csv(unit.path(args.calibration_table), index=False, float_format="%.6g")
    return c.fit


def _write_probe(
    args: argparse.Namespace,
    advice: Advice,
    fit: mdl.Fit,
    runs: pd.DataFrame,
    source_cfg: Mapping[str, Any],
    unit: OutputUnit,
) -> None:
    defaults = source_cfg.get("defaults") or defaults_from_runs(runs, fit.node.combined_mode)
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


def run(args: argparse.Namespace) -> int:
    """The command on parsed arguments, so that ``cli.py`` can mount ``build_parser()`` as a
    parent of its ``advise`` subcommand and dispatch here."""
    try:
        # One unit: the verification config and the cross-validation appear together or not
        # at all, checked (and locked) before the fit, so a refused output costs no time.
        _check_options(args)
        inputs = _inputs(args.results, args.calibrate, args.probe_config)
        with output_unit(_outputs(args), inputs=inputs, mkdir=True) as unit:
            printed = io.StringIO()
            try:
                with contextlib.redirect_stdout(printed):
                    _advise(args, unit)
            finally:
                sys.stdout.write(printed.getvalue())
            if args.text is not None:
                unit.path(args.text).write_text(printed.getvalue())
    except CodlError as exc:
        print(f"codl advise: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A file the user named cannot be read or written (permissions, a full disk).
        print(f"codl advise: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _advise(args: argparse.Namespace, unit: OutputUnit) -> None:
    """Fit (and calibrate), advise, print, and write the unit's members."""
    results: Path = args.results
    fitted = fit_results(
        results,
        fit_cores=args.fit_cores,
        mode=args.mode,
        boot=args.boot,
        seed=args.seed,
        handoff=args.handoff,
    )
    runs, steps, data, fit = fitted.runs, fitted.steps, fitted.data, fitted.fit
    if args.calibrate is not None:
        if args.cross_validate is not None:
            raise CodlError(
                "--cross-validate with --calibrate: the held-out runs are the fit's "
                "machine's, the calibrated model another's; run them apart"
            )
        fit = _calibrate(args, fit, unit)
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
        _write_verification(args, advice, fit, runs, data, fitted.source_cfg, unit)
    if args.probe_out is not None:
        _write_probe(args, advice, fit, runs, fitted.source_cfg, unit)
    print_advice(advice, fit, args.out, args.tie, args.prefer)
    if args.cross_validate is not None:
        _cross_validate(args, runs, steps, fit, data, unit)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
