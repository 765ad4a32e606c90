"""``codl regenerate`` (``make results``): rebuild every committed result set's derived tables and
figures from what the set commits, through the functions the workflow's rules call, and compare
them with the committed files.

A result set is ``results/<set>/`` in one layout (docs/outputs.md, "Result sets"): the config
that made it, ``tables/``, ``figures/``, optionally ``README.md`` and ``advice/``; a set measured
over several invocations keeps each as a sub-set of the same layout and its pooled tables in
its own ``tables/``. The traces are not committed, so what a set can rebuild is what its merged
tables derive:

- ``compare``: the comparison and decomposition from ``runs.csv`` and ``steps.csv.gz``
  (``steps.analysis.recompare_tables``), then the figures those tables suffice for;
- ``pooled``: the per-setting inflation (``gil_inflation.csv``, ``pooled_inflation.csv``) and
  the hand-off's throughput over torch's from the runs the ``launch_sleeps`` rule tabled
  (``gil_runs.csv``), pooled over the sub-sets' tables in a parent, with the invocation levels
  (``pooled_levels.csv``, ``steps.levels``).

CSVs are compared by columns and values (numbers to a relative tolerance), figures are drawn
without error and not compared by pixels. A set with nothing to rebuild it from is reported as
such, with the reason.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import numpy as np
import pandas as pd

from codl.analysis import pooled as pl
from codl.analysis.decompose import COMPUTE_SPAN
from codl.outputs import output_unit
from codl.paths import RESERVED_SET_NAMES, ResultPaths
from codl.steps.analysis import recompare_tables, table_figures_to
from codl.steps.levels import levels_to

log = logging.getLogger(__name__)

#: Relative tolerance of a regenerated number against its committed value: the CSV round trip
#: keeps 17 significant digits, so anything above float noise is a change of the analysis.
RTOL = 1e-9

_STD = ResultPaths()
#: The parts of a set's layout, relative to its directory; any other directory is a sub-set.
TABLES = _STD.tables.relative_to(_STD.set_dir)
FIGURES = _STD.figures.relative_to(_STD.set_dir)
ADVICE = _STD.advice.relative_to(_STD.set_dir)
PARTS = frozenset({str(TABLES), str(FIGURES), str(ADVICE)})
#: The runs' own directory under results/ (traces, never committed), never a set.
NOT_SETS = RESERVED_SET_NAMES

#: The launch roles' per-run table (the ``launch_sleeps`` rule's) and what derives from it:
#: the table's historical name (gil_inflation.csv, before the ``pooled`` rule) and today's.
GIL_RUNS = _STD.gil_runs_table.name
INFLATION_NAMES = ("gil_inflation.csv", _STD.pooled_inflation_table.name)
THROUGHPUT = _STD.pooled_throughput_table.name
LEVELS = _STD.pooled_levels_table.name


class Status(StrEnum):
    OK = "ok"
    DIFFERS = "differs"
    CANNOT = "cannot rebuild"


@dataclass(frozen=True)
class Verdict:
    """One set's outcome: ``details`` name each differing ``<file> <column>`` or the reason it
    cannot be rebuilt; ``checked`` the committed files compared."""

    name: str
    status: Status
    details: tuple[str, ...] = ()
    checked: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    def line(self) -> str:
        head = f"{self.name}: {self.status.value}"
        if self.status is Status.OK:
            return f"{head} ({len(self.checked)} files)" + "".join(f"\n  {d}" for d in self.skipped)
        return head + "".join(f"\n  {d}" for d in self.details)


@dataclass
class _Rebuilt:
    """What a set's rebuild made: committed file -> regenerated file, and the steps that could
    not run (with why)."""

    files: dict[Path, Path] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def result_sets(results: Path) -> list[Path]:
    """Every committed set and sub-set under ``results``, parents before their sub-sets."""

    def walk(d: Path) -> Iterator[Path]:
        yield d
        for sub in sorted(p for p in d.iterdir() if p.is_dir() and p.name not in PARTS):
            yield from walk(sub)

    tops = sorted(p for p in results.iterdir() if p.is_dir() and p.name not in NOT_SETS)
    return [s for top in tops for s in walk(top)]


def sub_sets(set_dir: Path) -> list[Path]:
    return sorted(p for p in set_dir.iterdir() if p.is_dir() and p.name not in PARTS)


def _csv(path: Path) -> pd.DataFrame:
    # Ids are hex strings: one of only digits must not be read as a number.
    return pl.read_runs(path)


def csv_differences(committed: Path, made: Path, *, rtol: float = RTOL) -> list[str]:
    """``<file> <column>`` for each column of ``committed`` that ``made`` lacks or holds other
    values in (numbers to ``rtol`` relative, NaN equal to NaN); empty when they agree."""
    want, got = _csv(committed), _csv(made)
    name = committed.name
    if len(want) != len(got):
        return [f"{name} rows: {len(want)} committed, {len(got)} regenerated"]
    out = [f"{name} {c}: not regenerated" for c in want.columns if c not in got]
    out += [f"{name} {c}: not committed" for c in got.columns if c not in want]
    for c in (c for c in want.columns if c in got):
        if not _same(want[c], got[c], rtol):
            out.append(f"{name} {c}")
    return out


def _same(a: pd.Series, b: pd.Series, rtol: float) -> bool:
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    na, nb = a.isna(), b.isna()
    if not na.equals(nb):
        return False
    num_a, num_b = pd.to_numeric(a, errors="coerce"), pd.to_numeric(b, errors="coerce")
    if num_a.notna().sum() == (~na).sum() and num_b.notna().sum() == (~nb).sum():
        x, y = num_a.to_numpy(float), num_b.to_numpy(float)
        return bool(np.isclose(x, y, rtol=rtol, atol=0.0, equal_nan=True).all())
    return bool((a[~na].astype(str) == b[~nb].astype(str)).all())


def _attempt(rebuilt: _Rebuilt, what: str, step: Callable[[], None]) -> None:
    try:
        step()
    except Exception as exc:
        rebuilt.failed.append(f"{what}: {type(exc).__name__}: {exc}")


def _rebuild_compare(tables: Path, out: Path, rebuilt: _Rebuilt) -> None:
    """The ``compare`` rule's comparison and decomposition again from the merged runs and steps
    tables, and the figures those tables suffice for."""
    std = ResultPaths(root=out, set_name="x")
    runs, steps = tables / std.runs_table.name, tables / std.steps_table.name
    comparison = tables / std.comparison_table.name
    if not (runs.is_file() and steps.is_file() and comparison.is_file()):
        return
    # The committed decomposition's name (.csv or .csv.gz), so that --write replaces it.
    dec = next(iter(sorted(tables.glob("decomposition.csv*"))), None)
    if dec is not None and (measured := _from_traces(dec)):
        # Rebuilt from the steps table it would lose what only the traces held.
        rel = tables.parent
        rebuilt.skipped.append(
            f"{comparison.relative_to(rel)}, {dec.relative_to(rel)}: not rebuilt ({measured})"
        )
        return
    work = out / "compare"
    work.mkdir(parents=True)
    shutil.copy(runs, work / runs.name)
    shutil.copy(steps, work / steps.name)
    kw = {
        "runs_table": work / runs.name,
        "steps_table": work / steps.name,
        "comparison_table": work / comparison.name,
        "decomposition_table": work / (dec.name if dec else std.decomposition_table.name),
    }

    def compare() -> None:
        recompare_tables(**kw)
        rebuilt.files[comparison] = kw["comparison_table"]
        if dec is not None:
            rebuilt.files[dec] = kw["decomposition_table"]
        table_figures_to(**kw, figdir=out / "figures")
        # A committed figure the tables redraw is replaced with them (--write); figures are
        # drawn without error, not compared by pixels.
        for made in sorted((out / "figures").glob("*")):
            committed = tables.parent / FIGURES / made.name
            if committed.is_file():
                rebuilt.files[committed] = made

    _attempt(rebuilt, "compare", compare)


#: Decomposition parts a steps table cannot give (``decompose.parts_from_steps``): the bucket
#: arrivals' peer wait and transfer and the kernels' slowdown.
_TRACE_PARTS = ("peer_wait_ms", "transfer_ms", "gpu_slowdown_ms")


def _from_traces(decomposition: Path) -> str:
    """What of a committed decomposition only the traces could measure ('' if nothing): the
    launch roles' host time of the compute span (a steps table holds the whole step's), or the
    parts of buckets and kernels."""
    df = pd.read_csv(decomposition, usecols=lambda c: c in {"host_source", *_TRACE_PARTS})
    if "host_source" in df and (df["host_source"] == COMPUTE_SPAN).any():
        return "its host time is of the compute span, measured from the traces"
    parts = [c for c in _TRACE_PARTS if c in df and df[c].notna().any()]
    if parts:
        return f"its {', '.join(parts)} were measured from the traces"
    return ""


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    with output_unit([path], mkdir=True) as unit:
        df.to_csv(unit.path(path), index=False)


def _has_twins(gil_runs: Path) -> bool:
    return "twin_id" in pd.read_csv(gil_runs, nrows=0).columns


def _rebuild_pooled(set_dir: Path, out: Path, rebuilt: _Rebuilt) -> None:
    """The ``pooled`` rule's tables from the per-run GIL tables. The set's own table and each
    sub-set's are one invocation each: ``gil_inflation.csv`` is the set's own invocation (the
    retired script's per-invocation table), the pooled tables pool every invocation, and the
    levels treat each as a level (``steps.levels``)."""
    tables = set_dir / TABLES
    own = tables / GIL_RUNS
    parts = [s / TABLES / GIL_RUNS for s in sub_sets(set_dir) if (s / TABLES / GIL_RUNS).is_file()]
    # A sub-set tabled before runs named their twin (the scripts of 2026-11: a pilot) has no
    # block pairing to pool; it stays out, and says so.
    old_parts = [p for p in parts if not _has_twins(p)]
    rebuilt.skipped += [f"{p.relative_to(set_dir)}: not pooled (no twin_id)" for p in old_parts]
    parts = [p for p in parts if p not in old_parts]
    sources = [own, *parts] if own.is_file() else parts
    derived = [tables / n for n in (*INFLATION_NAMES, THROUGHPUT) if (tables / n).is_file()]
    if not sources or (not derived and not (tables / LEVELS).is_file()):
        return
    work = out / "pooled"
    old = [p for p in sources if not _has_twins(p)]
    if old:
        # Tabled before runs named their twin (by the scripts of 2026-11): no block pairing
        # to redo; the committed derived tables stand as they were made.
        rebuilt.skipped += [
            f"{c.relative_to(set_dir)}: not rebuilt ({o.relative_to(set_dir)} has no twin_id)"
            for c in derived
            for o in old[:1]
        ]
        return

    def pooled() -> None:
        runs = pl.pool_runs([_csv(p) for p in sources]) if len(sources) > 1 else _csv(sources[0])
        made = {n: pl.inflation(runs) for n in INFLATION_NAMES}
        if own.is_file() and len(sources) > 1:
            made["gil_inflation.csv"] = pl.inflation(_csv(own))
        made[THROUGHPUT] = pl.throughput_versus_torch(runs)
        for committed in derived:
            _write_csv(made[committed.name], work / committed.name)
            rebuilt.files[committed] = work / committed.name

    _attempt(rebuilt, "pooled", pooled)
    if (tables / LEVELS).is_file() and len(sources) > 1:

        def levels() -> None:
            levels_to(sources, work / LEVELS)
            rebuilt.files[tables / LEVELS] = work / LEVELS

        _attempt(rebuilt, "levels", levels)


def _inputs_gone(set_dir: Path) -> str:
    """Why a set with nothing the rules can rebuild is so: its README's first line if it says,
    else what it lacks."""
    readme = set_dir / "README.md"
    if readme.is_file():
        for line in readme.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                return line.strip()
    return (
        f"no {_STD.runs_table.name} + {_STD.steps_table.name} + {_STD.comparison_table.name} "
        f"and no {GIL_RUNS} in {TABLES}/: its traces and runs are not committed"
    )


def rebuild(set_dir: Path, out: Path) -> _Rebuilt:
    """Rebuild one set's derived tables and figures into ``out`` (not its sub-sets')."""
    rebuilt = _Rebuilt()
    _rebuild_compare(set_dir / TABLES, out, rebuilt)
    _rebuild_pooled(set_dir, out, rebuilt)
    return rebuilt


def check_set(set_dir: Path, out: Path, *, name: str, write: bool = False) -> Verdict:
    """Rebuild ``set_dir`` into ``out`` and compare; with ``write``, replace every committed file
    the rebuild made (as one unit) before comparing."""
    rebuilt = rebuild(set_dir, out)
    if not rebuilt.files and not rebuilt.failed:
        return Verdict(name, Status.CANNOT, (_inputs_gone(set_dir),))
    if write and rebuilt.files:
        with output_unit(list(rebuilt.files)) as unit:
            for committed, made in rebuilt.files.items():
                shutil.copyfile(made, unit.path(committed))
    details = list(rebuilt.failed)
    for committed, made in sorted(rebuilt.files.items()):
        if ".csv" in committed.suffixes:
            details += csv_differences(committed, made)
    checked = tuple(str(p.relative_to(set_dir)) for p in sorted(rebuilt.files))
    status = Status.DIFFERS if details else Status.OK
    return Verdict(name, status, tuple(details), checked, tuple(rebuilt.skipped))


def regenerate(results: Path, *, sets: Sequence[str] = (), write: bool = False) -> list[Verdict]:
    """Check (or with ``write`` rebuild) every set under ``results`` (or only ``sets``, names
    relative to ``results``, each with its sub-sets); one verdict per set, printed as it
    comes."""
    chosen = [
        s
        for s in result_sets(results)
        if not sets or any(s.relative_to(results).is_relative_to(n) for n in sets)
    ]
    missing = [n for n in sets if not (results / n).is_dir()]
    if missing:
        raise ValueError(f"{', '.join(missing)}: no such result set under {results}")
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="codl-regenerate-") as tmp:
        for i, s in enumerate(chosen):
            v = check_set(s, Path(tmp) / str(i), name=str(s.relative_to(results)), write=write)
            log.info("%s", v.line())
            print(v.line(), flush=True)
            verdicts.append(v)
    return verdicts


def exit_code(verdicts: Sequence[Verdict]) -> int:
    """0 when every set that can be rebuilt is ``ok``, else 1."""
    return int(any(v.status is Status.DIFFERS for v in verdicts))


__all__ = [
    "RTOL",
    "Status",
    "Verdict",
    "check_set",
    "csv_differences",
    "exit_code",
    "rebuild",
    "regenerate",
    "result_sets",
]
