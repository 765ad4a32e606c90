"""What every ``codl`` parser shares: one-line errors and the types of numeric options.

A numeric option is parsed by :func:`finite_float` or :func:`bounded_int`, so NaN, infinities,
negative or absurdly large values end the command before it works, with exit status 2 and one
line that names the option (argparse prefixes ``argument --boot:``): a hostile or mistyped
value must not reach a loop bound (``--cores 1e9`` planned a billion workers) or an interval.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
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
