"""The advisor's file steps: what the workflow's advisor rules and ``codl advise`` call.

They read the merged tables and the config, call the pure advisor (``codl.advisor``: model,
advice, interference map, verification) and write tables, configs and figures. The config's
optional ``advisor`` section switches them on (``codl.steps.workflow.advisor_targets``).

The loop: a config with ``advisor: {advise: true}`` -> runs -> ``advise_to`` fits the model and
writes ``advice/verify.yaml`` (the advice and its neighbours, with ``advisor.predictions``
pointing at ``advice/predictions.csv``, the model's prediction for every verification
setting) -> the verification runs (``--configfile results/<name>/advice/verify.yaml``) ->
``predicted_vs_measured_to`` compares the predictions with what those runs measured.
"""

from __future__ import annotations

import csv
import datetime
import gzip
import logging
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from codl.advisor import advise as adv
from codl.advisor import interference_map as imap
from codl.advisor import model as mdl
from codl.advisor.advise import HandoffChoice, choose_handoff
from codl.advisor.settings import advisor_settings, cores_per_rank
from codl.advisor.verify import (
    Order,
    file_sha256,
    prediction_order,
    score_predictions,
    verification_predictions,
)
from codl.config import build_plan, load_yaml
from codl.errors import CodlError, ConfigError
from codl.figures import FigureName
from codl.outputs import output_unit, verify_member
from codl.paths import ResultPaths
from codl.spec import RunSpec

#: Table paths relative to a results directory, from the one object that owns them.
CONFIG_NAME = "config.yaml"
log = logging.getLogger(__name__)


def _utc_now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).isoformat()


#: What a results directory holds for ``codl advise``, for the messages that name it.
RESULTS_EXPECTED = (
    "a results directory holding the workflow's tables/runs.csv and tables/steps.csv.gz"
)
#: How many bytes of a table's end are read to tell a cut-off last row.
_TAIL_BYTES = 1 << 16


def _expected(path: Path) -> str:
    rows = "one row per measured step" if path.name.startswith("steps") else "one row per run"
    return f"a CSV table with a header row and {rows}"


def _cut_off(path: Path, columns: int) -> bool:
    """Whether a plain CSV table's last row stops mid-row: no final newline and fewer fields
    than the header (a copy or a write cut short). A gzip table says so itself (EOFError)."""
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - _TAIL_BYTES))
        tail = fh.read()
    if tail.endswith(b"\n"):
        return False
    last = tail.rsplit(b"\n", 1)[-1].decode("utf-8", errors="replace")
    return len(next(csv.reader([last]), [])) < columns


def read_table(path: Path, *, missing: str = "missing table") -> pd.DataFrame:
    """The CSV table ``path`` (gzip-compressed by its suffix), or a CodlError of one line naming
    it and what was expected: missing (``missing`` says what, where it is looked for), not a
    file, empty, not CSV, not UTF-8, a gzip stream cut short, a last row cut off."""
    if not path.exists():
        raise CodlError(f"{path}: {missing}")
    if not path.is_file():
        raise CodlError(f"{path}: not a regular file, expected {_expected(path)}")
    if path.stat().st_size == 0:
        raise CodlError(f"{path}: empty file, expected {_expected(path)}")
    verify_member(path)  # compare's tables are read only as a whole unit
    try:
        # Whole-file type inference: chunked reading guesses a sparse text column
        # (outlier_reason) differently per chunk and warns (DtypeWarning).
        table = pd.read_csv(path, low_memory=False)
    except pd.errors.EmptyDataError:
        raise CodlError(f"{path}: no header row, expected {_expected(path)}") from None
    except pd.errors.ParserError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CodlError(f"{path}: not a CSV table ({first}), expected {_expected(path)}") from None
    except UnicodeDecodeError as exc:
        raise CodlError(
            f"{path}: not UTF-8 text ({exc.reason}), expected {_expected(path)}"
        ) from None
    except gzip.BadGzipFile as exc:
        raise CodlError(
            f"{path}: not gzip-compressed ({exc}), expected {_expected(path)}"
        ) from None
    except (EOFError, zlib.error) as exc:
        raise CodlError(
            f"{path}: its gzip stream is cut short or damaged ({exc}), expected "
            f"{_expected(path)}, compressed whole"
        ) from None
    if path.suffix != ".gz" and _cut_off(path, len(table.columns)):
        raise CodlError(
            f"{path}: its last row stops mid-row (the file was cut short?), expected "
            f"{_expected(path)}, each row complete"
        )
    return table


def _read_table(path: Path, results: Path) -> pd.DataFrame:
    return read_table(path, missing=f"missing table ({results} must hold the workflow's tables/)")


def located(exc: mdl.ModelError, **tables: Path) -> mdl.ModelError:
    """``exc`` with the table names the model uses (``runs.csv``, ``steps.csv.gz``: keyword
    ``runs``, ``steps``) replaced by the paths read, so that the one line names the file. The
    model is pure and knows no paths; its messages name the table at their start or after a
    "; " (``model._require_finite`` joins several)."""
    text = str(exc)
    for name, key in (("runs.csv", "runs"), ("steps.csv.gz", "steps")):
        if key in tables:
            # Escaped, not pasted into the template: a path may hold backslashes.
            named = str(tables[key]).replace("\\", "\\\\")
            text = re.sub(rf"(^|; ){re.escape(name)}:", rf"\g<1>{named}:", text)
    return mdl.ModelError(text)


def source_config(results: Path) -> dict[str, Any]:
    """RESULTS/config.yaml, the config the runs came from, or {} when the workflow left none."""
    path = results / CONFIG_NAME
    if not path.exists():
        return {}
    if not path.is_file():
        raise CodlError(f"{path}: not a regular file, expected the YAML config the runs came from")
    try:
        cfg = load_yaml(path)
    except ConfigError as exc:
        text = exc.one_line()
        # load_yaml's problems name the file already.
        raise CodlError(text if text.startswith(str(path)) else f"{path}: {text}") from None
    for key in ("defaults", "slurm"):
        if cfg.get(key) is not None and not isinstance(cfg[key], Mapping):
            raise CodlError(
                f"{path}: {key}: got a {type(cfg[key]).__name__}, expected a mapping (the "
                "config the runs came from)"
            )
    return cfg


def check_results(results: Path) -> None:
    """CodlError when ``results`` is missing (named by the table looked for there, as a
    directory without tables is) or not a directory (a file given for it)."""
    if not results.exists():
        runs_table = ResultPaths.merged_tables_of(results)[0]
        raise CodlError(
            f"{runs_table}: missing table ({results} does not exist; expected {RESULTS_EXPECTED})"
        )
    if not results.is_dir():
        raise CodlError(f"{results}: not a directory, expected {RESULTS_EXPECTED}")


@dataclass(frozen=True, kw_only=True)
class FittedResults:
    """A results directory's tables and the model fitted on them (``fit_results``)."""

    runs: pd.DataFrame
    steps: pd.DataFrame
    data: mdl.RunData
    fit: mdl.Fit
    source_cfg: Mapping[str, Any]
    handoff: HandoffChoice


def fit_results(
    results: Path,
    *,
    fit_cores: int | None = None,
    mode: str | None = None,
    boot: int = 200,
    seed: int = 0,
    handoff: str | None = None,
) -> FittedResults:
    """Fit the model on RESULTS/tables/{runs.csv,steps.csv.gz}; the cores per rank of the runs
    are ``fit_cores`` or RESULTS/config.yaml's ``slurm.cpus_per_rank``."""
    check_results(results)
    runs_table, steps_table = ResultPaths.merged_tables_of(results)
    runs = _read_table(runs_table, results)
    steps = _read_table(steps_table, results)
    source_cfg = source_config(results)
    cores = fit_cores or config_cores(source_cfg, results / CONFIG_NAME) or _measured_cores(runs)
    if cores is None:
        raise CodlError(
            f"cores per rank of the measured runs unknown: {results / CONFIG_NAME} has no "
            "slurm.cpus_per_rank and runs.csv no `cpus` on every row; pass --fit-cores"
        )
    try:
        mdl.check_tables(runs, steps, runs_name=str(runs_table), steps_name=str(steps_table))
        runs, steps, chosen = choose_handoff(runs, steps, handoff=handoff, combined_mode=mode)
        data = mdl.run_data(runs, steps, combined_mode=mode)
        fit = mdl.fit(data, cores=int(cores), boot=boot, seed=seed)
    except mdl.ModelError as exc:
        raise located(exc, runs=runs_table, steps=steps_table) from None
    return FittedResults(
        runs=runs, steps=steps, data=data, fit=fit, source_cfg=source_cfg, handoff=chosen
    )


def config_cores(cfg: Mapping[str, Any], path: Path) -> int | None:
    """``slurm.cpus_per_rank`` of the config ``cfg`` (read from ``path``), None when it has
    none."""
    value = cfg["slurm"].get("cpus_per_rank") if cfg.get("slurm") else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CodlError(
            f"{path}: slurm.cpus_per_rank: got {value!r}, expected a whole "
            "number >= 1 (or pass --fit-cores)"
        )
    return value


def _measured_cores(runs: pd.DataFrame) -> int | None:
    """The CPUs per rank the runs had (runs.csv ``cpus``, from each trace) when every row says,
    the most common count; None when a row does not (summarized before the column)."""
    if "cpus" not in runs:
        return None
    cpus = pd.to_numeric(runs["cpus"], errors="coerce")
    if cpus.isna().any() or not (cpus >= 1).all() or cpus.empty:
        return None
    return int(cpus.mode().max())


def _read(path: Path) -> pd.DataFrame:
    return read_table(Path(path), missing="no such table")


def _write_table(t: pd.DataFrame, table: Path) -> None:
    """``t`` as the csv ``table``, whole or not at all (codl.outputs)."""
    with output_unit({"table": Path(table)}, mkdir=True) as unit:
        t.to_csv(unit.path(Path(table)), index=False)


def map_to(
    *,
    runs: Path,
    steps: Path,
    cfg: Mapping[str, Any],
    table: Path,
    figures: Sequence[Path],
    boot: int = 2000,
) -> pd.DataFrame:
    """The interference map of the config's runs: ``table`` (csv) and its figure."""
    from codl.figures.registry import FigureInputs, draw_figure

    plan = build_plan(cfg, source="the config")
    t = imap.build_map(imap.with_costs(_read(runs), plan.specs), _read(steps), boot=boot)
    _write_table(t, table)
    draw_figure(FigureName.INTERFERENCE_MAP, FigureInputs(interference_map=t), figures)
    return t


def _one_workload(runs: pd.DataFrame, specs: Mapping[str, RunSpec]) -> None:
    """The model describes one workload on one node: refuse a sweep over batch or cost."""
    r = imap.with_costs(runs, specs)
    r = r[r["mode"].isin(mdl.COMBINED_MODES)]
    varied = [c for c in ("model", "batch_size", "image_size", "cost") if r[c].nunique() > 1]
    if varied:
        raise CodlError(
            f"advise: the combined runs vary {varied}; the model fits one workload (one "
            "model, batch size and loader cost): advise on one slice of the sweep"
        )


def record_predictions(
    vcfg: dict[str, Any], fit: mdl.Fit, advice: adv.Advice, named: Path, write: Path
) -> pd.DataFrame:
    """Write the model's prediction for every setting of the verification config ``vcfg`` to
    ``write`` (where the file is written now; ``named``: its final path, which the config
    names) and record its sha256 and the time in ``vcfg``'s ``advisor`` section, the config
    the verification runs start from, so the comparison can prove the predictions came first
    (docs/advisor.md, "Predictions before measurements")."""
    vcfg["advisor"] = {"predictions": str(named)}
    plan = build_plan(vcfg, source="the verification config")
    table = verification_predictions(fit, advice, plan)
    table.to_csv(write, index=False)
    vcfg["advisor"]["predictions_sha256"] = file_sha256(write)
    vcfg["advisor"]["predicted_at"] = _utc_now()
    return table


def advise_to(
    *,
    runs: Path,
    steps: Path,
    cfg: Mapping[str, Any],
    text: Path,
    verify: Path,
    predictions: Path,
    boot: int = 200,
    seed: int = 0,
) -> adv.Advice:
    """Fit, advise for ``advisor.cores`` (default: the measured cores per rank), and write the
    advice (``advice_record``), the verification config and the predictions of its settings."""
    run_table, step_table = _read(runs), _read(steps)
    mdl.check_tables(run_table, step_table, runs_name=str(runs), steps_name=str(steps))
    _one_workload(run_table, build_plan(cfg, source="the config").specs)
    fit_cores = cores_per_rank(cfg)
    try:
        run_table, step_table, chosen = choose_handoff(run_table, step_table)
        data = mdl.run_data(run_table, step_table)
        fit = mdl.fit(data, cores=fit_cores, boot=boot, seed=seed)
    except mdl.ModelError as exc:
        raise located(exc, runs=Path(runs), steps=Path(steps)) from None
    settings = advisor_settings(cfg)
    prefer = adv.Prefer(settings.prefer)
    advice = adv.advise(fit, cores=settings.cores or fit_cores, prefer=prefer, handoff=chosen)
    best = adv.best_measured(data)
    vcfg = adv.verification_config(
        advice,
        fit,
        defaults=cfg.get("defaults") or {},
        slurm=cfg.get("slurm"),
        repeats=settings.repeats,
        best=best,
    )
    verification = adv.verify_lines(
        Path(verify),
        command=adv.snakemake_command(Path(verify)),
        repeats=settings.repeats,
        predictions=Path(predictions),
    )
    record = advice_record(
        advice,
        fit,
        gain=adv.predicted_gain(fit, advice, best),
        verify=verification,
        prefer=prefer,
        notes=adv.efficiency_lines(run_table, best, mode=fit.node.combined_mode),
    )
    for path in (text, verify, predictions):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    record_predictions(vcfg, fit, advice, predictions, predictions)
    # The results directory the tables are in, as `codl advise RESULTS` names it.
    Path(verify).write_text(adv.render_config(vcfg, advice, str(Path(runs).parent.parent)))
    Path(text).write_text(record)
    return advice


def advice_record(
    advice: adv.Advice,
    fit: mdl.Fit,
    *,
    gain: adv.Gain | None,
    verify: Sequence[str],
    prefer: adv.Prefer,
    tie: float = 0.01,
    notes: Sequence[str] = (),
    between: str = "",
    before_details: str = "",
    details: bool = True,
) -> str:
    """advice.txt: the summary ``codl advise`` prints, then ``between`` (the cross-validation
    it printed), then the details under a rule. An advice file keeps the details, unlike the
    terminal: it is the record of the advice, read in the report or beside the verification's
    results long after, when no ``--details`` can be asked for, and a refit on the
    verification runs is compared with its parameters. ``before_details``: what the details
    open with (the calibration's probe table). ``details`` False: what ``codl advise`` prints
    without ``--details``, which ends by saying how to see them."""
    summary = adv.summary_text(
        advice, boot=bool(fit.boot), run_cv=fit.run_cv, gain=gain, verify=verify, notes=notes
    )
    if not details:
        return f"{summary}{between}\n{adv.DETAILS_HINT}\n"
    details_text = adv.details_text(advice, fit, tie=tie, prefer=prefer)
    return f"{summary}{between}\n{adv.DETAILS_RULE}\n{before_details}{details_text}"


def predicted_vs_measured_to(
    *,
    predictions: Path,
    runs: Path,
    table: Path,
    figures: Sequence[Path],
    steps: Path | None = None,
    planned_sha256: str = "",
    planned_at: str = "",
) -> pd.DataFrame:
    """Score ``predictions`` against the runs; ``planned_sha256`` and ``planned_at`` are what
    the verification config recorded when it was written (``advisor.predictions_sha256``,
    ``advisor.predicted_at``): each row says whether its prediction provably came first
    (``verify.Order``), and a prediction changed after its runs started is logged."""
    from codl.figures.registry import FigureInputs, draw_figure

    run_table = _read(runs)
    t = score_predictions(
        _read(predictions), run_table, _read(steps) if steps is not None else None
    )
    if not t["n_runs"].any():
        raise CodlError(
            f"{runs}: no run matches a setting of {predictions}; run the verification config"
        )
    mtime = datetime.datetime.fromtimestamp(Path(predictions).stat().st_mtime, tz=datetime.UTC)
    t = prediction_order(
        t,
        run_table,
        sha256=file_sha256(predictions),
        modified_at=mtime.isoformat(),
        planned_sha256=planned_sha256,
        planned_at=planned_at,
    )
    measured = t[t["n_runs"] > 0]
    bad = measured[measured["order"] != Order.PREDICTED_FIRST.value]
    if len(bad):
        log.warning(
            "%s: %d of %d measured settings not provably predicted before their runs (%s): "
            "see the order column of %s",
            predictions,
            len(bad),
            len(measured),
            ", ".join(sorted(set(bad["order"]))),
            table,
        )
    _write_table(t, table)
    draw_figure(FigureName.PREDICTED_VS_MEASURED, FigureInputs(predictions=t), figures)
    return t


def probe_of(
    results: Path, *, cores: int | None = None, prefer: str = adv.Prefer.HEADROOM.value
) -> dict[str, Any]:
    """The probe config of the fit in ``results`` (``calibrate.probe_config``), as
    ``codl advise RESULTS --probe-out`` writes it with the same ``cores`` and ``prefer``. It
    depends on the fit's point estimates alone, so no bootstrap is drawn: the same config for
    any ``--boot``."""
    from codl.advisor.calibrate import probe_config

    fitted = fit_results(results, boot=0)
    advice = adv.advise(
        fitted.fit,
        cores=cores or fitted.fit.cores,
        prefer=adv.Prefer(prefer),
        handoff=fitted.handoff,
    )
    defaults = fitted.source_cfg.get("defaults") or adv.defaults_from_runs(
        fitted.runs, fitted.fit.node.combined_mode
    )
    return probe_config(fitted.fit, advice, defaults=defaults, slurm=fitted.source_cfg.get("slurm"))


def probe_workflow_config(
    cfg: Mapping[str, Any], *, source: str = "the workflow config"
) -> dict[str, Any]:
    """The config the workflow runs for ``advisor.calibrate: FIT``: FIT's probe (``probe_of``)
    in place of ``defaults`` and ``experiments``, its ``slurm`` section under the config's own
    keys but with the probe's ``cpus_per_rank`` (the core budget the probe measures), the rest
    of the config kept. The probe is derived from the committed fit alone, so its runs are in
    the DAG from the start (no checkpoint); the ``calibrate`` rule checks that they are the
    runs of the probe config ``codl advise FIT --probe-out`` writes. ``codl plan`` plans the
    same config (``source``: the file, for the error)."""
    settings = advisor_settings(cfg)
    clash = [k for k in ("defaults", "experiments") if cfg.get(k)]
    clash += ["advisor.advise"] if settings.advise else []
    if clash:
        raise ConfigError(
            [
                f"advisor.calibrate: got {' and '.join(clash)} too, expected neither: the "
                "runs are the fit's probe and the calibrated fit writes the advice"
            ],
            source=source,
        )
    probe = probe_of(Path(settings.calibrate), cores=settings.cores or None, prefer=settings.prefer)
    out = dict(cfg)
    out["defaults"] = probe["defaults"]
    out["experiments"] = probe["experiments"]
    out["slurm"] = {
        **probe["slurm"],
        **(cfg.get("slurm") or {}),
        "cpus_per_rank": probe["slurm"]["cpus_per_rank"],
    }
    return out
