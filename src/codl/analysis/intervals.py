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


def covered_ns(a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per interval of ``a`` ((n, 2), any order), its overlap with ``b`` (disjoint, sorted, as
    from ``interval_union``): the measure of ``b`` below its end minus that below its start,
    from ``b``'s cumulative lengths and two binary searches (no loop over intervals)."""
    if not len(a) or not len(b):
        return np.zeros(len(a), dtype=np.int64)
    lengths = b[:, 1] - b[:, 0]
    before = np.concatenate(([0], np.cumsum(lengths)))

    def below(x: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        k = np.searchsorted(b[:, 0], x, side="right") - 1
        inside = np.clip(x - b[np.maximum(k, 0), 0], 0, lengths[np.maximum(k, 0)])
        return np.where(k < 0, 0, before[np.maximum(k, 0)] + inside)

    return below(a[:, 1]) - below(a[:, 0])


def overlap_ns(a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> int:
    """Total overlap of two disjoint sorted interval sets (as from ``interval_union``)."""
    return int(covered_ns(a, b).sum())


class UnionOverlap:
    """The overlap of a fixed interval set ``target`` with the union of intervals that arrive
    in blocks, in memory bounded by the blocks' disorder: pieces of the union that end at or
    before ``watermark`` (no later interval starts before it) are measured and dropped."""

    def __init__(self, target: npt.NDArray[np.int64]) -> None:
        self.target = target
        self.covered = 0
        self._open = np.empty((0, 2), dtype=np.int64)

    def add(
        self, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], watermark: int
    ) -> None:
        u = interval_union(
            np.concatenate((self._open[:, 0], starts)), np.concatenate((self._open[:, 1], ends))
        )
        done = u[:, 1] <= watermark
        self.covered += overlap_ns(u[done], self.target)
        self._open = u[~done]

    def finish(self) -> int:
        self.covered += overlap_ns(self._open, self.target)
        self._open = self._open[:0]
        return self.covered
