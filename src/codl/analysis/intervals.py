"""Sets of half-open time intervals (int64 ns): the union and the overlap of two unions."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def interval_union(starts: npt.ArrayLike, ends: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Merge intervals; returns an (n, 2) array of disjoint sorted intervals.

    Touching intervals ([0, 5) and [5, 9)) merge; empty or reversed ones are dropped.
    """
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    keep = e > s
    s, e = s[keep], e[keep]
    if len(s) == 0:
        return np.empty((0, 2), dtype=np.int64)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # A new interval starts wherever the start lies beyond everything seen so far.
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return np.column_stack([s[first], reach[last]]).astype(np.int64)


def overlap_ns(a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> int:
    """Total overlap of two disjoint sorted interval sets (as from ``interval_union``)."""
    i = j = 0
    total = 0
    while i < len(a) and j < len(b):
        lo = max(a[i, 0], b[j, 0])
        hi = min(a[i, 1], b[j, 1])
        if hi > lo:
            total += int(hi - lo)
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return total
