"""The ``slow_calls`` rule (workflow/rules/slow_calls.smk): every slow CUDA runtime API call of
the runs that record each call's scheduling evidence (``trace.cuda_api_sched``), attributed
against the run's compute twin (``codl.analysis.calls.attribute_trace``: preempted, blocked or
on CPU), in one table, ``tables/slow_calls.csv.gz``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from codl.analysis import calls
from codl.outputs import output_unit

log = logging.getLogger(__name__)


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
