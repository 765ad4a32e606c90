"""The claims registry: each headline number of the README and the results pages as a row that
names its statistic, its counts (runs, blocks, invocations) and how it is computed from a
committed table.

A claim is computed by one of two declarative expressions, never by evaluating a string:

- a *cell*: ``source`` (a CSV under ``results/``), ``where`` (column: value, all equal) selecting
  exactly one row, ``value`` and ``interval`` naming its columns, counts as columns or integers;
  or, with ``reduce`` (one of :class:`Reduce`), the rows ``where`` selects reduced to a number
  (the median of a column of per-run errors, say), each row a run;
- a *function*: ``function`` naming one of :data:`codl.claims.compute.FUNCTIONS`, ``sources``
  and ``where`` its arguments (e.g. the invocation-level inflation over several results
  directories' runs tables).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from codl.errors import CodlError

#: Where the registry lives, relative to the checkout's root.
REGISTRY: Final = Path("docs") / "claims.yaml"
_FIELDS: Final = frozenset(
    {
        "id",
        "what",
        "statistic",
        "source",
        "sources",
        "function",
        "where",
        "value",
        "interval",
        "n_runs",
        "n_blocks",
        "n_invocations",
        "format",
        "digits",
        "reduce",
    }
)
#: A count or a value a row cannot hold: counts of a table row are whole, values finite.
Scalar = str | int | float | bool
#: A count: a number, a column, or columns that add up (loading runs and their twins).
Count = str | int | tuple[str, ...] | None


class Format(enum.StrEnum):
    """How a claim's number reads in the text."""

    CHANGE = "change"  # a ratio as a change: 1.27 -> "+27 %"
    INFLATION = "inflation"  # a change stored as ratio - 1: 0.016 -> "+1.6 %"
    PERCENT = "percent"  # a fraction as a percentage: 0.03 -> "3.0 %"
    RATIO = "ratio"  # a ratio as a factor: 4.93 -> "4.9x"
    MS = "ms"  # milliseconds: "8.6 ms"
    NUMBER = "number"  # a plain number with thousands separators: "3,562"


class Reduce(enum.StrEnum):
    """How a column over several rows becomes one number: named, so a row cannot hold code."""

    MEDIAN = "median"
    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    MEDIAN_ABS = "median_abs"
    MAX_ABS = "max_abs"


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One headline number: what it is, its statistic, and the expression that computes it."""

    id: str
    what: str
    statistic: str
    format: Format
    digits: int
    sources: tuple[Path, ...]
    where: Mapping[str, Scalar] = field(default_factory=dict)
    function: str | None = None
    value: str | None = None
    interval: tuple[str, str] | None = None
    reduce: Reduce | None = None
    n_runs: Count = None
    n_blocks: Count = None
    n_invocations: Count = None


@dataclass(frozen=True, kw_only=True)
class Value:
    """A claim computed: its number, interval and counts (``None``: the claim has none)."""

    value: float
    lo: float | None
    hi: float | None
    n_runs: int | None
    n_blocks: int | None
    n_invocations: int | None


def _problem(where: str, msg: str) -> CodlError:
    return CodlError(f"{where}: {msg}")


def _count(raw: Any, where: str, key: str) -> Count:
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, list) and raw and all(isinstance(c, str) for c in raw):
        return tuple(raw)
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return raw
    raise _problem(
        where, f"{key}: got {raw!r}, expected a count, a column or a list of columns to add"
    )


def claim_from_dict(raw: Mapping[str, Any], *, where: str) -> Claim:
    """One registry row, checked: unknown keys, a missing expression or a bad format are
    refused with the row's place and the allowed values."""
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise _problem(where, f"unknown key(s) {unknown}, expected some of {sorted(_FIELDS)}")
    for key in ("id", "what", "statistic"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise _problem(where, f"{key}: missing, expected a non-empty string")
    where = f"{where} ({raw['id']})"
    try:
        fmt = Format(raw.get("format", Format.CHANGE))
    except ValueError:
        raise _problem(
            where, f"format: got {raw.get('format')!r}, expected one of {[f.value for f in Format]}"
        ) from None
    if ("source" in raw) == ("sources" in raw):
        raise _problem(where, "expected exactly one of source (one table) or sources (a list)")
    sources = (raw["source"],) if "source" in raw else tuple(raw["sources"])
    if (raw.get("function") is None) == (raw.get("value") is None):
        raise _problem(where, "expected exactly one of value (a column) or function (a name)")
    interval = raw.get("interval")
    if interval is not None and (
        not isinstance(interval, list) or len(interval) != 2 or raw.get("function")
    ):
        raise _problem(where, "interval: expected [low column, high column] of a cell claim")
    try:
        reduce = Reduce(raw["reduce"]) if raw.get("reduce") is not None else None
    except ValueError:
        raise _problem(
            where, f"reduce: got {raw['reduce']!r}, expected one of {[r.value for r in Reduce]}"
        ) from None
    if reduce is not None and (interval is not None or raw.get("function")):
        raise _problem(where, "reduce: a reduced column has no interval columns and no function")
    digits = raw.get("digits", 0)
    if not isinstance(digits, int) or isinstance(digits, bool) or not 0 <= digits <= 4:
        raise _problem(where, f"digits: got {digits!r}, expected 0 to 4")
    return Claim(
        id=raw["id"],
        what=raw["what"],
        statistic=raw["statistic"],
        format=fmt,
        digits=digits,
        sources=tuple(Path(s) for s in sources),
        where=dict(raw.get("where") or {}),
        function=raw.get("function"),
        value=raw.get("value"),
        interval=(str(interval[0]), str(interval[1])) if interval else None,
        reduce=reduce,
        n_runs=_count(raw.get("n_runs"), where, "n_runs"),
        n_blocks=_count(raw.get("n_blocks"), where, "n_blocks"),
        n_invocations=_count(raw.get("n_invocations"), where, "n_invocations"),
    )


def load_registry(path: Path) -> list[Claim]:
    """The registry's claims, in file order; a repeated id is refused."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CodlError(f"{path}: no such claims registry") from None
    rows = doc.get("claims") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise CodlError(f"{path}: expected a mapping with a list under 'claims'")
    claims = [claim_from_dict(r, where=f"{path}: claims[{i}]") for i, r in enumerate(rows)]
    seen: set[str] = set()
    for c in claims:
        if c.id in seen:
            raise CodlError(f"{path}: claim id {c.id!r} appears twice")
        seen.add(c.id)
    return claims


_SIGNED: Final = frozenset({Format.CHANGE, Format.INFLATION})


def _unit(x: float, fmt: Format) -> float:
    if fmt is Format.CHANGE:
        return 100 * (x - 1)
    return 100 * x if fmt in (Format.PERCENT, Format.INFLATION) else x


def _num(x: float, claim: Claim, *, sign: bool) -> str:
    y = _unit(x, claim.format)
    if not math.isfinite(y):
        return "n/a"
    plus = "+" if sign else ""
    text = f"{y:{plus},.{claim.digits}f}"
    # A change that rounds to zero prints as "+0", not "-0": the sign would be noise.
    return f"{0.0:{plus}.{claim.digits}f}" if float(text.replace(",", "")) == 0 else text


def render_value(claim: Claim, v: Value) -> str:
    """The number as the text prints it: ``+27 %``, ``4.9x``, ``8.6 ms``, ``3,562``."""
    signed = claim.format in _SIGNED
    n = _num(v.value, claim, sign=signed)
    suffix = {
        Format.CHANGE: " %",
        Format.INFLATION: " %",
        Format.PERCENT: " %",
        Format.RATIO: "x",
        Format.MS: " ms",
        Format.NUMBER: "",
    }[claim.format]
    return f"{n}{suffix}"


def render_interval(claim: Claim, v: Value) -> str:
    """``[+8, +50]``: the interval's ends in the value's unit, no unit repeated."""
    if v.lo is None or v.hi is None:
        raise CodlError(f"claim {claim.id}: has no interval to cite")
    signed = claim.format in _SIGNED
    return f"[{_num(v.lo, claim, sign=signed)}, {_num(v.hi, claim, sign=signed)}]"


def render(claim: Claim, v: Value, part: str = "full") -> str:
    """One part of a claim as cited in the text: ``full`` (value and interval, or the value
    alone), ``value``, ``interval``, ``n_runs``, ``n_blocks``, ``n_invocations``, or ``counts``
    (``12 blocks, 24 runs``)."""
    if part == "full":
        return render_value(claim, v) + (
            f" {render_interval(claim, v)}" if v.lo is not None else ""
        )
    if part == "value":
        return render_value(claim, v)
    if part == "interval":
        return render_interval(claim, v)
    if part in ("n_runs", "n_blocks", "n_invocations"):
        n = getattr(v, part)
        if n is None:
            raise CodlError(f"claim {claim.id}: has no {part} to cite")
        return f"{n:,}"
    if part == "counts":
        if v.n_blocks is None or v.n_runs is None:
            raise CodlError(f"claim {claim.id}: has no block and run counts to cite")
        return f"{v.n_blocks} blocks, {v.n_runs} runs"
    raise CodlError(f"claim {claim.id}: part {part!r} is not one of {list(PARTS)}")


PARTS: Final[Sequence[str]] = (
    "full",
    "value",
    "interval",
    "n_runs",
    "n_blocks",
    "n_invocations",
    "counts",
)
