"""The names the analysis modules share: table keys, the phases and loader stages as the tables'
columns spell them, the modes that load data, the trace tables a summary reads.

At the bottom of ``codl.analysis``: every module of the package may import it and it imports none
of them, so reading a trace (``chunked``) and reducing it (``summarize``) no longer import each
other for a constant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from codl.pinning import HELPER_ROLES as HELPER_ROLE_ENUMS
from codl.spec import Mode
from codl.trace.schema import LOADER_ITEM_STAGES, LoaderStage, Phase, Table

KEYS = ["rank", "step"]
# The phases summarized per step, each as `<phase>_ms` (allreduce apart: see APP_ALLREDUCE).
STEP_PHASES: tuple[str, ...] = tuple(
    p.value
    for p in (
        Phase.STEP,
        Phase.DATA_WAIT,
        Phase.H2D,
        Phase.FORWARD,
        Phase.BACKWARD,
        Phase.OPTIMIZER,
        Phase.COMPUTE,
        Phase.SLEEP,
    )
)
# The app's own `allreduce` span (comm mode) is named apart from `allreduce_ms`, which sums the
# per-bucket rows of events/comm and is what the comm component is compared on.
APP_ALLREDUCE = "allreduce_wall"
# Every loader stage, item stages first: the per-step loader columns `loader_<stage>_ms`.
LOADER_STAGES: tuple[str, ...] = (*LOADER_ITEM_STAGES, LoaderStage.COLLATE.value)

# Modes that read a data set, as the strings the tables hold; spec.Mode owns the vocabulary.
LOADING_MODES = frozenset(m.value for m in Mode if m.loads)

#: The launch helpers whose on-CPU time per step the steps table carries beside the main
#: thread's (``launch_run_ms``): together they are the CPU the launch path occupies, which the
#: throughput model charges against the loader's cores (docs/advisor.md, "Equations").
#: pinning.HELPER_ROLES owns the roles; the tables hold their values.
HELPER_ROLES: tuple[str, ...] = tuple(r.value for r in HELPER_ROLE_ENUMS)

API_STEP_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    "api_calls": "int64",
    "api_us_mean": "float64",
    "launch_kernel_calls": "int64",
    "launch_kernel_us_mean": "float64",
}

# The trace tables summarize reads (schema.TABLES is every table the store knows, with columns).
SUMMARY_TABLES: tuple[str, ...] = (
    Table.APP,
    Table.COMM,
    Table.LOADER,
    Table.CUDA,
    Table.SCHED,
    Table.THREADS,
)
# Read for analysis.decompose only (phase-boundary schedstat, GPU arrivals of the buckets, the
# kernel's scheduler record); optional: older traces lack them and read as empty.
SUMMARY_TABLES += (Table.PHASE_SCHED, Table.COMM_GPU, Table.SCHED_SWITCH, Table.SCHED_WAKING)
# Read for analysis.load only (per-core busy ticks: the run's background load).
SUMMARY_TABLES += (Table.CPU,)


def warmup_steps(attrs: Mapping[str, Any]) -> int:
    return int(attrs.get("warmup_steps", 0))
