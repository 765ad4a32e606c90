"""A claim's number from its committed table(s): a cell selected by equal columns, or one of a
few named functions over runs tables. Nothing here evaluates a string."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from codl.analysis.levels import Method, invocation_ratios, level_intervals
from codl.claims.registry import Claim, Count, Reduce, Scalar, Value
from codl.errors import CodlError


def _key(x: object) -> str:
    """A cell and a registry value compared as text: CSV cells come back as bool, int, float
    or str, while YAML gives ``true``, ``12`` or ``0.0`` for the same thing."""
    if isinstance(x, bool | np.bool_):
        return "true" if x else "false"
    if isinstance(x, float | np.floating):
        if math.isnan(x):
            return ""
        return str(int(x)) if float(x).is_integer() else repr(float(x))
    if isinstance(x, int | np.integer):
        return str(int(x))
    text = str(x)
    return text.lower() if text.lower() in ("true", "false") else text


def select(table: pd.DataFrame, where: Mapping[str, Scalar], *, what: str) -> pd.DataFrame:
    """The rows of ``table`` whose columns equal ``where``'s values; an unknown column is
    refused, naming the columns there are."""
    missing = sorted(set(where) - set(table.columns))
    if missing:
        raise CodlError(f"{what}: no column(s) {missing}; columns: {list(table.columns)}")
    mask = pd.Series(True, index=table.index)
    for col, want in where.items():
        mask &= table[col].map(_key) == _key(want)
    return table[mask]


def _read(root: Path, source: Path, claim: Claim) -> pd.DataFrame:
    path = root / source
    try:
        return pd.read_csv(path, keep_default_na=True)
    except FileNotFoundError:
        raise CodlError(f"claim {claim.id}: source {source} does not exist") from None


def _count(row: pd.Series, spec: Count, claim: Claim) -> int | None:
    if spec is None or isinstance(spec, int):
        return spec
    cols = (spec,) if isinstance(spec, str) else spec
    absent = [c for c in cols if c not in row.index]
    if absent:
        raise CodlError(f"claim {claim.id}: count column(s) {absent} not in {claim.sources[0]}")
    return sum(int(row[c]) for c in cols)


def _cell(claim: Claim, root: Path) -> Value:
    what = f"claim {claim.id} ({claim.sources[0]})"
    if claim.value is None:
        raise CodlError(f"{what}: a cell claim names its value column")
    table = _read(root, claim.sources[0], claim)
    rows = select(table, claim.where, what=what)
    if claim.reduce is not None:
        return _reduced(claim, rows, claim.reduce, claim.value, what=what)
    if len(rows) != 1:
        raise CodlError(f"{what}: where {dict(claim.where)} selects {len(rows)} rows, expected 1")
    row = rows.iloc[0]
    cols = [claim.value, *(claim.interval or ())]
    absent = [c for c in cols if c not in row.index]
    if absent:
        raise CodlError(f"{what}: no column(s) {absent}")
    lo, hi = (float(row[c]) for c in claim.interval) if claim.interval else (None, None)
    return Value(
        value=float(row[claim.value]),
        lo=lo,
        hi=hi,
        n_runs=_count(row, claim.n_runs, claim),
        n_blocks=_count(row, claim.n_blocks, claim),
        n_invocations=_count(row, claim.n_invocations, claim),
    )


_REDUCERS: Final[Mapping[Reduce, Callable[[pd.Series], float]]] = {
    Reduce.MEDIAN: lambda s: float(s.median()),
    Reduce.MEAN: lambda s: float(s.mean()),
    Reduce.MAX: lambda s: float(s.max()),
    Reduce.MIN: lambda s: float(s.min()),
    Reduce.MEDIAN_ABS: lambda s: float(s.abs().median()),
    Reduce.MAX_ABS: lambda s: float(s.abs().max()),
}


def _reduced(claim: Claim, rows: pd.DataFrame, reduce: Reduce, column: str, *, what: str) -> Value:
    """The rows' ``column`` reduced to one number; each row is a run, so n_runs is the rows'
    count unless the registry gives it."""
    if rows.empty:
        raise CodlError(f"{what}: where {dict(claim.where)} selects no row")
    if column not in rows:
        raise CodlError(f"{what}: no column {column!r}")
    first = rows.iloc[0]
    return Value(
        value=_REDUCERS[reduce](rows[column].astype(float)),
        lo=None,
        hi=None,
        n_runs=len(rows) if claim.n_runs is None else _count(first, claim.n_runs, claim),
        n_blocks=_count(first, claim.n_blocks, claim),
        n_invocations=_count(first, claim.n_invocations, claim),
    )


def invocation_inflation(claim: Claim, root: Path) -> Value:
    """Compute inflation with the invocation as a level (:mod:`codl.analysis.levels`, its
    ``invocation means``): each source is one invocation's runs table (``gil_runs.csv``), each
    loading run paired with its compute twin of the same block; each invocation's mean log
    ratio is one sample, Student t on n_invocations - 1 degrees of freedom. Blocks of one
    invocation share its machine and its day, so they are not independent of it: pooling them
    as if they were narrows the interval by what the invocations disagree on."""
    tables = {str(s): _read(root, s, claim) for s in claim.sources}
    levels = level_intervals(invocation_ratios(tables))
    what = f"claim {claim.id} ({', '.join(tables)})"
    rows = select(levels, {**claim.where, "method": Method.INVOCATION_MEANS.value}, what=what)
    if len(rows) != 1:
        raise CodlError(f"{what}: where {dict(claim.where)} selects {len(rows)} settings")
    row = rows.iloc[0]
    finite = math.isfinite(row["low"]) and math.isfinite(row["high"])
    return Value(
        value=float(row["value"]),
        lo=float(row["low"]) if finite else None,
        hi=float(row["high"]) if finite else None,
        n_runs=int(row["n_runs"]),
        n_blocks=int(row["n_blocks"]),
        n_invocations=int(row["n_invocations"]),
    )


#: The named functions a registry row may call: the expressions a cell cannot hold.
FUNCTIONS: Final[Mapping[str, Callable[[Claim, Path], Value]]] = {
    "invocation_inflation": invocation_inflation,
}


def evaluate(claim: Claim, root: Path) -> Value:
    """The claim computed from its sources under ``root`` (the checkout)."""
    if claim.function is None:
        return _cell(claim, root)
    fn = FUNCTIONS.get(claim.function)
    if fn is None:
        raise CodlError(
            f"claim {claim.id}: function {claim.function!r} is not one of {sorted(FUNCTIONS)}"
        )
    return fn(claim, root)
