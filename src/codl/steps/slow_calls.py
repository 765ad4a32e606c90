"""The ``slow_calls`` rule (workflow/rules/slow_calls.smk): every slow CUDA runtime API call of
the runs that record each call's scheduling evidence (``trace.cuda_api_sched``), attributed
against the run's compute twin (``codl.analysis.calls.attribute_trace``: preempted, blocked or
on CPU), in one table, ``tables/slow_calls.csv.gz``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from codl.analysis import calls
from codl.outputs import output_unit
from codl.paths import ResultPaths
from codl.spec import RunSpec

log = logging.getLogger(__name__)


def slow_call_twins(specs: Mapping[str, RunSpec], analysed: Iterable[str]) -> dict[str, str]:
    """Each analysed run with the calls' evidence that loads and computes -> its compute twin
    (``Mode.compute_twin``), where the twin is analysed too: a slow call is one far above the
    twin's median for its API name, so a run without its twin has no baseline to be slow
    against, and the twin itself is the baseline, not a run to attribute."""
    ids = list(analysed)
    present = set(ids)
    out: dict[str, str] = {}
    for rid in ids:
        spec = specs[rid]
        twin_mode = spec.mode.compute_twin
        if not spec.trace.cuda_api_sched or twin_mode is None:
            continue
        twin = spec.with_mode(twin_mode).run_id
        if twin in present:
            out[rid] = twin
        else:
            log.warning("run %s: its compute twin %s is not analysed; no slow calls", rid, twin)
    return out


def slow_calls_targets(paths: ResultPaths, twins: Mapping[str, str]) -> list[str]:
    """The rule's output for the default target: none without a run to attribute."""
    return [str(paths.slow_calls_table)] if twins else []


def slow_calls_to(*, traces: Sequence[Path], twins: Sequence[Path], table: Path) -> pd.DataFrame:
    """Attribute each trace's slow calls against the twin's trace at the same place of
    ``twins``; write them, one row per slow call (``calls.CALL_COLUMNS``), as one unit."""
    if len(traces) != len(twins):
        raise ValueError(
            f"traces, twins: got {len(traces)} and {len(twins)} paths, expected one twin per run"
        )
    frames = [calls.attribute_trace(t, w) for t, w in zip(traces, twins, strict=True)]
    slow = (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame(columns=list(calls.CALL_COLUMNS))
    )
    with output_unit([table], inputs=[*traces, *twins], mkdir=True) as unit:
        # The final name's suffix (.csv.gz) picks the compression; the unit keeps names.
        slow.to_csv(unit.path(table), index=False)
    log.info("wrote %s (%d slow calls of %d runs)", table, len(slow), len(traces))
    return slow
