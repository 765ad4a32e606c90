"""What every ``codl`` parser shares: one-line errors and the types of numeric options.

A numeric option is parsed by :func:`finite_float` or :func:`bounded_int` (a time of
``codl export --from/--to`` by :func:`export_time`), so NaN, infinities, negative or absurdly
large values end the command before it works, with exit status 2 and one line that names the
option (argparse prefixes ``argument --boot:``): a hostile or mistyped value must not reach a
loop bound (``--cores 1e9`` planned a billion workers) or an interval.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import NoReturn

# Numeric limits the options share: far beyond real use, far inside what the code computes.
MAX_CORES = 4096  # CPUs per rank (a whole large node)
MAX_REPLICATES = 100_000  # bootstrap replicates
MAX_STEPS = 10_000_000
MAX_REPEATS = 1000  # runs of one setting
MAX_BOOT_SEED = 2**63 - 1  # a seed travels as int64 (torch, numpy)
# --from/--to of export: codl.trace.export's bound (not imported: it loads pandas, which
# `codl run`'s start-up must not; tests/test_output_units.py checks the two agree).
MAX_WINDOW_S = 1e7
MAX_NS = 2**63 - 1  # a CLOCK_MONOTONIC time as the trace stores it (int64)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``prog: error: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def finite_float(lo: float, hi: float) -> Callable[[str], float]:
    """An argparse type: a finite float in ``[lo, hi]``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and lo <= value <= hi):
            raise argparse.ArgumentTypeError(f"got {text!r}, expected a number in [{lo:g}, {hi:g}]")
        return value

    parse.__name__ = "number"
    return parse


def bounded_int(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer in ``[lo, hi]`` (digits only: ``1e9`` or ``2.5`` are not)."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"got {text!r}, expected an integer in [{lo}, {hi}]")
        return value

    parse.__name__ = "integer"
    return parse


_NS_PER: dict[str, int] = {"s": 10**9, "ms": 10**6, "us": 10**3, "\u00b5s": 10**3, "ns": 1}
_NUMBER = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d{1,3}))?\s*(s|ms|us|\u00b5s|ns)?")
# Perfetto's timecode, as its UI prints and copies a time: [Nd]HH:MM:SS.mmm uuu nnn (the groups
# separated by spaces or thin spaces; any of them may be left out).
_TIMECODE = re.compile(r"(?:(\d+)d)?(\d{1,2}):([0-5]\d):([0-5]\d)(?:\.([\d \u2009_]{1,12}))?")
_MONO = re.compile(r"mono:(\d{1,19})")


def export_time(text: str) -> tuple[int, bool]:
    """Parse one bound of ``codl export --from/--to``: ``(ns, monotonic)``.

    On the export's time axis (nanoseconds since the run began, ``monotonic`` False):
    seconds (``1.27``), a number with a unit (``1270ms``, ``1270000us``, ``1270000000ns``) or
    Perfetto's timecode (``00:00:01.270 000 000``), at most MAX_WINDOW_S seconds. ``mono:NS``:
    CLOCK_MONOTONIC ns as the trace's tables store them (``monotonic`` True). Decimal
    arithmetic, so a time copied from an export selects the nanosecond it names.
    """
    t = text.strip()
    if m := _MONO.fullmatch(t):
        return _checked(text, int(m.group(1)), MAX_NS), True
    ns: int | None = None
    if m := _TIMECODE.fullmatch(t):
        days, hours, minutes, seconds, frac = m.groups()
        digits = re.sub(r"[ \u2009_]", "", frac or "")
        if len(digits) <= 9:
            whole = ((int(days or 0) * 24 + int(hours)) * 60 + int(minutes)) * 60 + int(seconds)
            ns = whole * 10**9 + int(digits.ljust(9, "0"))
    elif m := _NUMBER.fullmatch(t):
        number, exponent, unit = m.groups()
        try:
            value = Decimal(number) * Decimal(10) ** int(exponent or 0) * _NS_PER[unit or "s"]
            ns = int(value.to_integral_value())
        except InvalidOperation:
            ns = None
    return _checked(text, ns, round(MAX_WINDOW_S * 1e9)), False


def _checked(text: str, ns: int | None, hi: int) -> int:
    if ns is None or not 0 <= ns <= hi:
        raise argparse.ArgumentTypeError(
            f"got {text!r}, expected a time since the run began in [0, {MAX_WINDOW_S:g}] s "
            "(1.27, 1270ms, 1270000us, 1270000000ns or Perfetto's 00:00:01.270 000 000), "
            "or mono:NS (CLOCK_MONOTONIC ns as the trace stores them)"
        )
    return ns


# The checks of tests/test_output_units.py take every numeric option by this name.
export_time.__name__ = "number"
