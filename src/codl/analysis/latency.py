"""CUDA runtime API latencies reduced block by block into fixed-size histograms.

A long run makes ~10^8 runtime calls; the summary wants their exact p50 and p99 and the
API-latency figure their CDF per name. Neither needs the calls themselves:

- ``ExactLatency`` counts every duration below ``EXACT_CAP_NS`` (1 ms) in one bin per
  nanosecond (8 MiB of counts) and keeps the few longer calls' durations as they are, so its
  order statistics, and the quantiles interpolated between them, are exactly those of the
  whole column (``Series.quantile``'s linear rule, ``median``'s mean of the middle two). Its
  memory grows only with the calls over 1 ms, the slow tail attribution is about.
- ``NameHistogram`` counts the calls per (name, log-linear bucket): 16 buckets per octave
  (bucket edges ~4.4 % apart), the bucket's upper edge standing for its calls. The CDF drawn
  from it is exact at every edge; its size is the names times the buckets in use, whatever the
  number of calls.
"""

from __future__ import annotations

import functools
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pandas as pd

EXACT_CAP_NS: Final = 1 << 20
# Log-linear buckets from a float64's exponent and its top 4 mantissa bits (HDR-histogram
# style): one shift of the value's bits, no log() per call.
_MANTISSA_BITS: Final = 4
_SHIFT: Final = 52 - _MANTISSA_BITS
_ONE_NS: Final = int(np.array(1.0).view(np.int64) >> _SHIFT)  # bucket of 1 ns
_BUCKETS: Final = 64 << _MANTISSA_BITS  # 1 ns .. 2^64 ns: every int64 duration

_Ints = npt.NDArray[np.int64]
HIST_COLUMNS: Final = {"name": "str", "us": "float64", "calls": "int64"}


# Keys are bincounted once this many have gathered: one bincount's fresh count array and
# its addition cost ~2 ns per bin, as much as counting a 1 Mi-row block's keys. They gather in
# one buffer made once (a fresh array per block costs its page faults, ~2 ns a value, and
# joining the blocks' arrays a copy).
_PENDING_KEYS: Final = 1 << 22


class ExactLatency:
    """Exact order statistics of int64 nanosecond durations added block by block, in two sets
    at once: every duration, and those flagged (the launches among the runtime calls). One
    histogram counts both: bin ``2 * ns + flag``."""

    def __init__(self) -> None:
        self._counts = np.zeros(2 * EXACT_CAP_NS, dtype=np.int64)
        self._pending: _Ints | None = None  # made at the first add
        self._pending_n = 0
        self._long: list[_Ints] = []
        self._long_flagged: list[_Ints] = []

    def add(self, ns: _Ints, flagged: npt.NDArray[np.bool_] | None = None) -> None:
        # Counts and sums come from the histogram at the end: here only the passes that fill it.
        if not len(ns):
            return
        if flagged is None:
            flagged = np.zeros(len(ns), dtype=np.bool_)
        if int(ns.min()) < 0:
            raise ValueError("negative duration: the trace is checked for these")
        if int(ns.max()) >= EXACT_CAP_NS:
            long = ns >= EXACT_CAP_NS
            self._long.append(ns[long])
            self._long_flagged.append(ns[long & flagged])
            ns, flagged = ns[~long], flagged[~long]
        if self._pending is None:
            self._pending = np.empty(_PENDING_KEYS, dtype=np.int64)
        while len(ns):
            if self._pending_n == _PENDING_KEYS:
                self._flush()
            take = min(len(ns), _PENDING_KEYS - self._pending_n)
            key = self._pending[self._pending_n : self._pending_n + take]
            np.left_shift(ns[:take], 1, out=key)
            key += flagged[:take]
            self._pending_n += take
            ns, flagged = ns[take:], flagged[take:]

    def _flush(self) -> None:
        if self._pending is not None and self._pending_n:
            keys = self._pending[: self._pending_n]
            self._counts += np.bincount(keys, minlength=2 * EXACT_CAP_NS)
            self._pending_n = 0

    def _set(self, flagged: bool) -> tuple[_Ints, _Ints]:
        """(counts per ns below the cap, the longer durations) of every duration or of the
        flagged ones."""
        self._flush()
        counts = self._counts[1::2] if flagged else self._counts[0::2] + self._counts[1::2]
        pieces = self._long_flagged if flagged else self._long
        long = np.concatenate(pieces) if pieces else np.empty(0, np.int64)
        return counts, long

    def calls(self, *, flagged: bool = False) -> int:
        counts, long = self._set(flagged)
        return int(counts.sum()) + len(long)

    def _sum_ns(self, flagged: bool) -> int:
        counts, long = self._set(flagged)
        # int64: below 2^20 ns times at most 2^43 calls per bin.
        return int(np.dot(counts, np.arange(EXACT_CAP_NS, dtype=np.int64))) + int(long.sum())

    def _order(self, ks: list[int], flagged: bool) -> list[int]:
        """The k-th smallest durations (0-based) for each k of ``ks``, of every duration or of
        the flagged ones."""
        counts, long = self._set(flagged)
        cum = np.cumsum(counts)
        below = int(cum[-1])
        long = np.sort(long)
        return [int(np.searchsorted(cum, k + 1)) if k < below else int(long[k - below]) for k in ks]

    def stats(self, prefix: str, *, flagged: bool = False) -> dict[str, float | int]:
        """``{prefix}_calls``, ``_us_mean``, ``_us_p50``, ``_us_p99`` as the summary has them
        from the whole column of microseconds (``summarize._latency_stats``), of every
        duration or of the flagged ones."""
        n = self.calls(flagged=flagged)
        if not n:
            return {f"{prefix}_calls": 0} | dict.fromkeys(
                (f"{prefix}_us_mean", f"{prefix}_us_p50", f"{prefix}_us_p99"), np.nan
            )
        pos = 0.99 * (n - 1)
        lo = int(np.floor(pos))
        mid = (n - 1) // 2
        ks = [mid, n // 2, lo, min(lo + 1, n - 1)]
        a, b, c, d = (np.float64(v) / 1e3 for v in self._order(ks, flagged))
        # numpy's median (the two middle values' mean) and linear quantile, on those values.
        p50 = float(np.mean([a, b])) if n % 2 == 0 else float(a)
        p99 = float(np.quantile(np.array([c, d]), pos - lo)) if lo + 1 < n else float(c)
        return {
            f"{prefix}_calls": n,
            f"{prefix}_us_mean": self._sum_ns(flagged) / 1e3 / n,
            f"{prefix}_us_p50": p50,
            f"{prefix}_us_p99": p99,
        }


def buckets(ns: _Ints) -> _Ints:
    """Log-linear bucket of each duration: 0 for 0 ns, else 1 + its offset from 1 ns."""
    b = np.right_shift(ns.astype(np.float64).view(np.int64), _SHIFT)
    b -= _ONE_NS - 1
    np.maximum(b, 0, out=b)
    return b


def bucket_upper_us(b: _Ints) -> npt.NDArray[np.float64]:
    """The upper edge (us) of buckets ``b``: the largest duration a bucket holds (0 for 0)."""
    bound = ((b + _ONE_NS) << _SHIFT).view(np.float64)  # the next bucket's first value
    return np.where(b > 0, np.ceil(bound) - 1.0, 0.0) / 1e3


# A name table this small gets one bin per (name code, bucket); a larger one is mapped to the
# names present in each block first.
_DIRECT_BINS: Final = 1 << 18


@functools.cache
def _short_buckets() -> npt.NDArray[np.int16]:
    """The bucket of every duration below EXACT_CAP_NS, looked up instead of computed."""
    return buckets(np.arange(EXACT_CAP_NS, dtype=np.int64)).astype(np.int16)


class NameHistogram:
    """Calls per (name code, bucket), added block by block."""

    def __init__(self, strings: list[str]) -> None:
        self._strings = strings
        self._counts: dict[int, npt.NDArray[np.int64]] = {}
        self._direct = len(strings) * _BUCKETS <= _DIRECT_BINS
        self._matrix = np.zeros(len(strings) * _BUCKETS if self._direct else 0, dtype=np.int64)
        self._key = np.empty(0, dtype=np.int64)
        self._bucket = np.empty(0, dtype=np.int16)

    def add(self, names: npt.NDArray[Any], ns: _Ints) -> None:
        if not len(ns):
            return
        if self._direct:
            # In arrays kept from block to block (fresh ones cost their page faults).
            if len(self._key) < len(ns):
                self._key = np.empty(len(ns), dtype=np.int64)
                self._bucket = np.empty(len(ns), dtype=np.int16)
            key, bucket = self._key[: len(ns)], self._bucket[: len(ns)]
            np.multiply(names, _BUCKETS, out=key)
            # Short calls' buckets looked up (clipped: the few long ones are redone).
            np.take(_short_buckets(), ns, mode="clip", out=bucket)
            key += bucket
            long = np.flatnonzero(ns >= EXACT_CAP_NS)
            if len(long):
                key[long] = names[long].astype(np.int64) * _BUCKETS + buckets(ns[long])
            self._matrix += np.bincount(key, minlength=len(self._matrix))
            return
        b = buckets(ns)
        present = np.flatnonzero(np.bincount(names, minlength=len(self._strings)))
        if len(present) == 1:
            self._add(int(present[0]), np.bincount(b, minlength=_BUCKETS))
            return
        dense = np.zeros(len(self._strings), dtype=np.int64)
        dense[present] = np.arange(len(present))
        key = dense[names] * _BUCKETS + b
        counts = np.bincount(key, minlength=len(present) * _BUCKETS).reshape(len(present), -1)
        for i, code in enumerate(present.tolist()):
            self._add(code, counts[i])

    def _add(self, code: int, counts: npt.NDArray[np.int64]) -> None:
        have = self._counts.get(code)
        self._counts[code] = counts if have is None else have + counts

    def _by_code(self) -> dict[int, npt.NDArray[np.int64]]:
        if not self._direct:
            return self._counts
        rows = self._matrix.reshape(len(self._strings), _BUCKETS)
        return {int(c): rows[c] for c in np.flatnonzero(rows.any(axis=1))}

    def frame(self) -> pd.DataFrame:
        """(name, us, calls): each non-empty bucket's upper edge and its calls."""
        parts = []
        for code, counts in sorted(self._by_code().items()):
            used = np.flatnonzero(counts)
            parts.append(
                pd.DataFrame(
                    {
                        "name": self._strings[code],
                        "us": bucket_upper_us(used.astype(np.int64)),
                        "calls": counts[used],
                    }
                )
            )
        if not parts:
            return pd.DataFrame({c: pd.Series(dtype=d) for c, d in HIST_COLUMNS.items()})
        return pd.concat(parts, ignore_index=True)
