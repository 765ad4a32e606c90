"""``codl check``: the advisor's out-of-sample checks (docs/advisor.md).

A check config's settings predicted by fits before its runs (``predict``) and scored against
them once measured (``score``); held-out budgets (``holdout``), core splits between fitted jobs
(``splits``, ``share``); the calibration's blind check (``uncalibrated``, which the workflow's
``calibrate`` rule calls, then ``blind`` on the verification runs), its leave-one-out check on
another machine's runs (``calibration``); the verification's headlines at run level
(``runlevel``). Each reads results directories as the workflow writes them (``tables/runs.csv``,
``tables/steps.csv.gz``, ``config.yaml``), writes its outputs as one unit and prints the table.
Exit 0, or 2 with a one-line error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from codl.advisor import model as mdl
from codl.advisor import verify
from codl.cli.options import MAX_BOOT_SEED, MAX_CORES, MAX_REPLICATES, Parser, bounded_int
from codl.config import build_plan, load_checked, load_yaml
from codl.errors import CodlError, ConfigError
from codl.outputs import output_unit
from codl.paths import ResultPaths
from codl.steps.advisor import CONFIG_NAME, fit_results, located, read_table

#: Labels of the blind check's two prediction tables, in the table's column names.
CALIBRATED, UNCALIBRATED = "calibrated", "uncalibrated"


def _read(path: Path, what: str) -> pd.DataFrame:
    return read_table(path, missing=f"missing {what}")


def _merged(results: Path) -> tuple[pd.DataFrame, pd.DataFrame, Path, Path]:
    runs_csv, steps_csv = ResultPaths.merged_tables_of(results)
    what = f"table (expected {results} to hold the workflow's tables/)"
    return _read(runs_csv, what), _read(steps_csv, what), runs_csv, steps_csv


def _config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CodlError(f"{path}: no such config file")
    return load_checked(path)


def _settings(path: Path) -> pd.DataFrame:
    cfg = _config(path)
    default = int((cfg.get("slurm") or {}).get("cpus_per_rank", 0))
    return verify.check_settings(build_plan(cfg, source=str(path)), default_cores=default)


def _write(out: Path, table: pd.DataFrame, *, inputs: Sequence[Path], fmt: str | None) -> None:
    with output_unit({"--out": out}, inputs=inputs, mkdir=True) as unit:
        table.to_csv(unit.path(out), index=False, float_format=fmt)


def _show(table: pd.DataFrame) -> None:
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def _fits_by_dataset(fits: Sequence[Path], boot: int, seed: int) -> dict[str, mdl.Fit]:
    """Each fit by the data set its config (FIT/config.yaml) reads; one fit without a config
    predicts every data set (the runs table does not name its data set)."""
    if len(fits) == 1 and not (fits[0] / CONFIG_NAME).is_file():
        return {verify.ANY_DATASET: fit_results(fits[0], boot=boot, seed=seed).fit}
    out = {}
    for d in fits:
        if not (d / CONFIG_NAME).is_file():
            raise CodlError(
                f"{d / CONFIG_NAME}: no such file; with several fits, each fit's config names "
                "the data set it predicts (defaults.dataset.name)"
            )
        # Read, not planned: a fit's config may predate today's schema; its data set is enough.
        try:
            cfg = load_yaml(d / CONFIG_NAME)
        except ConfigError as exc:
            raise CodlError(exc.one_line()) from None
        name = str(((cfg.get("defaults") or {}).get("dataset") or {}).get("name", ""))
        if not name:
            raise CodlError(f"{d / CONFIG_NAME}: no defaults.dataset.name: which data set it fits")
        out[name] = fit_results(d, boot=boot, seed=seed).fit
    return out


def cmd_predict(args: argparse.Namespace) -> int:
    settings = _settings(args.check)
    table = verify.predict_check(settings, _fits_by_dataset(args.fits, args.boot, args.seed))
    inputs = [args.check, *(p for d in args.fits for p in ResultPaths.merged_tables_of(d))]
    # One decimal: the committed predictions are a record read by eye before the runs.
    _write(args.out, table, inputs=inputs, fmt="%.1f")
    _show(table)
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    predicted = _read(args.predicted, "predictions (codl check predict's --out)")
    runs, steps, runs_csv, steps_csv = _merged(args.results)
    try:
        data = mdl.run_data(runs, steps)
    except mdl.ModelError as exc:
        raise located(exc, runs=runs_csv, steps=steps_csv) from None
    table = verify.score_check(predicted, _settings(args.check), data)
    if not table["n_runs"].notna().any():
        raise CodlError(f"{runs_csv}: no run of {args.check}; run the check config first")
    _write(args.out, table, inputs=[args.predicted, args.check, runs_csv, steps_csv], fmt="%.4g")
    _show(table)
    return 0


def cmd_holdout(args: argparse.Namespace) -> int:
    fitted = fit_results(args.results, boot=0)
    runs_csv, steps_csv = ResultPaths.merged_tables_of(args.results)
    try:
        table = verify.holdout_table(
            fitted.runs,
            fitted.steps,
            fit_cores=fitted.fit.cores,
            cores=args.cores,
            boot=args.boot,
            seed=args.seed,
        )
    except mdl.ModelError as exc:
        raise located(exc, runs=runs_csv, steps=steps_csv) from None
    _write(args.out, table, inputs=[runs_csv, steps_csv], fmt="%.4g")
    _show(table)
    return 0


def cmd_splits(args: argparse.Namespace) -> int:
    from codl.advisor.advise import advise_split

    fits = [fit_results(d, boot=args.boot, seed=args.seed).fit for d in args.fits]
    counts, table = advise_split(fits, cores=args.cores)
    table = table.assign(split=[" / ".join(map(str, x)) for x in table["split"]])
    inputs = [p for d in args.fits for p in ResultPaths.merged_tables_of(d)]
    _write(args.out, table, inputs=inputs, fmt="%.4g")
    print("advised:", " / ".join(map(str, counts)))
    _show(table)
    return 0


def cmd_share(args: argparse.Namespace) -> int:
    from codl.advisor.advise import advise_split
    from codl.advisor.settings import share_settings, share_specs
    from codl.steps.share import even_counts

    cfg = _config(args.config)
    settings = share_settings(cfg)
    if not settings.advise_from:
        raise CodlError(f"{args.config}: share.advise_from: none, expected a fit per job")
    specs = share_specs(cfg, build_plan(cfg, source=str(args.config)))
    fits = [fit_results(Path(d), boot=args.boot, seed=args.seed).fit for d in settings.advise_from]
    pool = settings.cpus or int((cfg.get("slurm") or {}).get("cpus_per_rank", 0))
    if not pool:
        raise CodlError(f"{args.config}: neither share.cpus nor slurm.cpus_per_rank: no pool")
    advised, _ = advise_split(fits, cores=pool)
    rows = []
    for split, counts in (("even", even_counts(pool, len(fits))), ("advised", advised)):
        for (job, spec), fit, cores in zip(specs.items(), fits, counts, strict=True):
            setting = pd.DataFrame(
                {"policy": [spec.pinning.policy.value], "workers": [spec.loader.workers]}
            ).assign(cores=cores)
            p = mdl.predict(fit, setting).iloc[0]
            rows.append(
                {
                    "pool": pool,
                    "split": split,
                    "job": job,
                    "cores": cores,
                    "workers": spec.loader.workers,
                    **{c: p[c] for c in ("throughput", "throughput_lo", "throughput_hi")},
                    **{c: p[c] for c in ("pred_lo", "pred_hi", "bound")},
                }
            )
    table = pd.DataFrame(rows)
    even = table[table["split"] == "even"].set_index("job")["throughput"]
    table["vs_even"] = table["throughput"] / table["job"].map(even) - 1
    _write(args.out, table, inputs=[args.config], fmt="%.4g")
    _show(table)
    return 0


def cmd_calibration(args: argparse.Namespace) -> int:
    from codl.advisor.calibrate import leave_one_out

    fit = fit_results(args.fit, boot=0).fit
    runs, steps, runs_csv, steps_csv = _merged(args.results)
    try:
        table = leave_one_out(fit, runs, steps, cores=fit.cores)
    except mdl.ModelError as exc:
        raise located(exc, runs=runs_csv, steps=steps_csv) from None
    _write(args.out, table, inputs=[runs_csv, steps_csv], fmt="%.4g")
    _show(table)
    e0, e1 = table["error_before"].abs(), table["error_after"].abs()
    print(
        f"|error| over {len(table)} runs before: median {100 * e0.median():.1f} %, worst "
        f"{100 * e0.max():.1f} %; after: median {100 * e1.median():.1f} %, worst "
        f"{100 * e1.max():.1f} %"
    )
    return 0


def _utc_now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).isoformat()


def cmd_uncalibrated(args: argparse.Namespace) -> int:
    calibrated = _read(args.predictions, "calibrated predictions (codl advise --predictions)")
    # As written: "-", "auto" or a number, never a float a missing value would make.
    calibrated["launch_cores"] = calibrated["launch_cores"].astype(str)
    fit = fit_results(args.fit, boot=args.boot, seed=args.seed).fit
    table = verify.uncalibrated_predictions(fit, calibrated, cores=args.cores)
    inputs = [args.predictions, *ResultPaths.merged_tables_of(args.fit)]
    outputs = {"--out": args.out, "--record": args.record}
    with output_unit(outputs, inputs=inputs, mkdir=True) as unit:
        table.to_csv(unit.path(args.out), index=False)
        # Hashed as written: the unit renames the file, its bytes stay.
        record = {
            "predictions": str(args.out),
            "predictions_sha256": verify.file_sha256(unit.path(args.out)),
            "predicted_at": _utc_now(),
        }
        unit.path(args.record).write_text(json.dumps(record, indent=1) + "\n")
    _show(table)
    return 0


def _in_set(results: Path, standard: Path) -> Path:
    """``standard`` (a path of ``ResultPaths()``) inside the result set ``results``."""
    return results / standard.relative_to(ResultPaths().set_dir)


def _scored(
    path: Path, runs: pd.DataFrame, steps: pd.DataFrame, record: Mapping[str, Any], where: Path
) -> pd.DataFrame:
    """The predictions at ``path`` scored on the runs with their proof of order against what
    ``record`` (at ``where``) says was planned."""
    missing = [k for k in ("predictions_sha256", "predicted_at") if not record.get(k)]
    if missing:
        raise CodlError(f"{where}: no {' or '.join(missing)}: the predictions' record is missing")
    table = _read(path, "predictions")
    table["launch_cores"] = table["launch_cores"].astype(str)
    scored = verify.score_predictions(table, runs, steps)
    mtime = datetime.datetime.fromtimestamp(path.stat().st_mtime, tz=datetime.UTC)
    return verify.prediction_order(
        scored,
        runs,
        sha256=verify.file_sha256(path),
        modified_at=mtime.isoformat(),
        planned_sha256=str(record["predictions_sha256"]),
        planned_at=str(record["predicted_at"]),
    )


def cmd_blind(args: argparse.Namespace) -> int:
    std = ResultPaths()
    verify_yaml = _in_set(args.calibrated, std.verify_config)
    record_json = _in_set(args.calibrated, std.uncalibrated_record)
    for path in (verify_yaml, record_json):
        if not path.is_file():
            raise CodlError(
                f"{path}: missing; expected {args.calibrated} to be a calibrated result set "
                "(the workflow's `advisor.calibrate` rules write it)"
            )
    probe = _read(ResultPaths.merged_tables_of(args.calibrated)[0], "probe runs table")
    runs, steps, runs_csv, steps_csv = _merged(args.verification)
    reused = sorted(set(runs["run_id"].astype(str)) & set(probe["run_id"].astype(str)))
    if reused:
        raise CodlError(f"{runs_csv}: runs {reused} are probe runs: not a blind check")
    recorded = (load_yaml(verify_yaml).get("advisor")) or {}
    uncal = json.loads(record_json.read_text())
    cal_csv = _in_set(args.calibrated, std.predictions_table)
    unc_csv = _in_set(args.calibrated, std.uncalibrated_predictions_table)
    scored = {
        UNCALIBRATED: _scored(unc_csv, runs, steps, uncal, record_json),
        CALIBRATED: _scored(cal_csv, runs, steps, recorded, verify_yaml),
    }
    if not scored[CALIBRATED]["n_runs"].any():
        raise CodlError(f"{runs_csv}: no run of a predicted setting; run the verification config")
    # The measured columns as the verification config scores them: against its predictions.
    table, summary = verify.blind_table(scored, measured_from=CALIBRATED)
    summary_path = args.summary or args.out.with_name(f"{args.out.stem}_summary.csv")
    inputs = [verify_yaml, record_json, cal_csv, unc_csv, runs_csv, steps_csv]
    outputs = {"--out": args.out, "--summary": summary_path}
    with output_unit(outputs, inputs=inputs, mkdir=True) as unit:
        table.to_csv(unit.path(args.out), index=False, float_format="%.4g")
        summary.to_csv(unit.path(summary_path), index=False, float_format="%.4g")
    cols = ["policy", "workers", "launch_cores", "advised", "n_runs", "measured"]
    cols += [f"{k}_{label}" for label in (UNCALIBRATED, CALIBRATED) for k in ("predicted", "error")]
    _show(table[[*cols, "vs_best", f"order_{CALIBRATED}"]])
    _show(summary)
    return 0


def cmd_runlevel(args: argparse.Namespace) -> int:
    runs_csv = ResultPaths.merged_tables_of(args.results)[0]
    runs = _read(runs_csv, f"runs table (expected {args.results} to hold tables/runs.csv)")
    table = verify.runlevel_table(runs, advice=args.advice, combined_mode=args.mode)
    if args.out is not None:
        _write(args.out, table, inputs=[runs_csv], fmt="%.4g")
    print(f"{args.results}: {len(runs)} runs; the advice {args.advice} over each setting:")
    _show(table)
    return 0


def _add(
    sub: Any, name: str, func: Callable[[argparse.Namespace], int], text: str
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=text, description=text.replace("%%", "%")
    )
    p.set_defaults(func=func)
    return p


def _out(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--out", type=Path, required=True, metavar="CSV", help=f"write {what} here")


def _boot(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--boot",
        type=bounded_int(0, MAX_REPLICATES),
        default=200,
        help="bootstrap replicates of the fit (0: none, no intervals)",
    )
    p.add_argument("--seed", type=bounded_int(0, MAX_BOOT_SEED), default=0)


def _add_checks(sub: Any) -> None:
    p = _add(
        sub,
        "predict",
        cmd_predict,
        "predict every run setting of a check config before it runs, by the fit whose data set "
        "it reads: a data run's loader capacity, a combined run's throughput, with 95 %% model "
        "and one-run intervals",
    )
    p.add_argument("check", type=Path, metavar="CHECK.yaml", help="the check config")
    p.add_argument("fits", type=Path, nargs="+", metavar="FIT", help="fits' results directories")
    _out(p, "the predictions")
    _boot(p)
    p = _add(
        sub,
        "score",
        cmd_score,
        "set a check config's predictions against its measured runs: delivered and measured "
        "(the model's reading) per-rank throughput, the errors and whether the intervals hold",
    )
    p.add_argument("predicted", type=Path, metavar="PREDICTED.csv", help="`predict`'s table")
    p.add_argument("check", type=Path, metavar="CHECK.yaml", help="the check config")
    p.add_argument("results", type=Path, metavar="CHECK_RESULTS", help="its results directory")
    _out(p, "the scored table")
    p = _add(
        sub,
        "holdout",
        cmd_holdout,
        "hold out the combined runs on one core budget: predicted by the fit on every other run "
        "and by a fit whose data runs had only the fit's budget",
    )
    p.add_argument("results", type=Path, help="the fit's results directory")
    p.add_argument("--cores", type=bounded_int(1, MAX_CORES), required=True, help="held budget")
    _out(p, "the two predictions")
    _boot(p)


def _add_splits(sub: Any) -> None:
    p = _add(
        sub,
        "splits",
        cmd_splits,
        "score every split of a node's cores between fitted jobs; print the advised one",
    )
    p.add_argument("fits", type=Path, nargs="+", metavar="FIT", help="one results dir per job")
    p.add_argument("--cores", type=bounded_int(1, MAX_CORES), required=True, help="the pool")
    _out(p, "every split's score")
    _boot(p)
    p = _add(
        sub,
        "share",
        cmd_share,
        "predict each job of a share config at its setting on its share of the even and of "
        "the advised split of the pool, before the experiment runs",
    )
    p.add_argument("config", type=Path, metavar="SHARE.yaml", help="a config with `share`")
    _out(p, "the predictions")
    _boot(p)


def _add_calibration(sub: Any) -> None:
    p = _add(
        sub,
        "uncalibrated",
        cmd_uncalibrated,
        "predict the calibrated predictions' settings by the uncalibrated fit, and record the "
        "file's sha256 and the time (the workflow's calibrate rule, before any verification run)",
    )
    p.add_argument("fit", type=Path, help="the fit's results directory")
    p.add_argument("predictions", type=Path, metavar="PREDICTIONS.csv", help="calibrated ones")
    _out(p, "the uncalibrated predictions")
    p.add_argument("--record", type=Path, required=True, metavar="JSON", help="sha256 and time")
    p.add_argument(
        "--cores",
        type=bounded_int(1, MAX_CORES),
        help="core budget per rank the advice was for (default: the fit's)",
    )
    _boot(p)
    p = _add(
        sub,
        "blind",
        cmd_blind,
        "the blind error table of a calibration: the calibrated and the uncalibrated "
        "predictions scored on the verification runs, with each table's proof of order",
    )
    p.add_argument(
        "calibrated",
        type=Path,
        metavar="CALIBRATED_SET",
        help="the result set of an `advisor.calibrate` config (its tables/ the probe's runs, "
        "its advice/ the predictions and their records)",
    )
    p.add_argument(
        "verification",
        type=Path,
        metavar="VERIFY_RESULTS",
        help="the result set of its advice/verify.yaml",
    )
    _out(p, "the table (per setting)")
    p.add_argument(
        "--summary",
        type=Path,
        metavar="CSV",
        help="write the summary here (default: OUT's name with _summary)",
    )
    p = _add(
        sub,
        "calibration",
        cmd_calibration,
        "predict each combined run of another machine's results by the fit calibrated on that "
        "machine's other runs (held out in turn), before and after",
    )
    p.add_argument("fit", type=Path, help="the fit's results directory")
    p.add_argument("results", type=Path, help="the other machine's results directory")
    _out(p, "the table")


def _add_runlevel(sub: Any) -> None:
    p = _add(
        sub,
        "runlevel",
        cmd_runlevel,
        "a verification's settings at run level: mean throughput with a t interval over blocks "
        "and the advice over each setting as a ratio with its interval",
    )
    p.add_argument("results", type=Path, help="the verification's results directory")
    p.add_argument("--advice", required=True, metavar="POLICY/WORKERS", help="the advised setting")
    p.add_argument(
        "--mode",
        choices=mdl.COMBINED_MODES,
        default=mdl.COMBINED_MODES[0],
        help="the combined mode of the settings (default: %(default)s)",
    )
    p.add_argument("--out", type=Path, metavar="CSV", help="also write the table here")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="codl check",
        description="Out-of-sample checks of the throughput model and its calibration "
        "(docs/advisor.md).",
    )
    sub = p.add_subparsers(dest="which", required=True, parser_class=Parser, metavar="CHECK")
    _add_checks(sub)
    _add_splits(sub)
    _add_calibration(sub)
    _add_runlevel(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """``codl check CHECK ...``: 0, or 2 with a one-line error on stderr."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (CodlError, OSError) as exc:
        # OSError: a file the user named cannot be read or written (permissions, a full disk).
        print(f"codl check {args.which}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
