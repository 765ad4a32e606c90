"""One OpenBLAS thread for the commands that read traces and tables.

numpy's OpenBLAS starts a thread per core when numpy is imported, and each spins for work
for a while before it sleeps. The analysis (summarize, inspect, compare, the figures, the
advisor) multiplies no matrix large enough to want them, and on the 16-core H200 node those
threads cost every `codl summarize` ~1.8 CPU-seconds for no wall time (10^6 events: 3.9
CPU-s against 2.1 in the same wall time), CPU that a matrix's summarize jobs, 16 at once,
take from one another (with one thread they finished 1.14x sooner at 10^6 events;
`docs/performance.md`). ``codl run`` keeps the default: on a CPU-only aarch64 machine
torch's own CPU compute is OpenBLAS's. So does a ``codl run`` that an analysis process
starts (the shared-node jobs of the workflow's share rule): it gets ``users_env``, the
environment without the count this process asked for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

BLAS_THREADS_VAR = "OPENBLAS_NUM_THREADS"
_ONE = "1"

# The variables this process set (not the user): only those are taken out again for the
# training runs it starts.
_ASKED: set[str] = set()


def one_blas_thread() -> None:
    """Ask OpenBLAS for one thread in this process (and the analysis processes it starts; a
    training run gets ``users_env``), where the user has not chosen a count. Nothing once
    numpy is imported: OpenBLAS reads the variable when it loads, and a process that set it
    later would only pass it to its children."""
    if "numpy" not in sys.modules and BLAS_THREADS_VAR not in os.environ:
        os.environ[BLAS_THREADS_VAR] = _ONE
        _ASKED.add(BLAS_THREADS_VAR)


def users_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` (this process's environment) as the user gave it: without the one thread that
    ``one_blas_thread`` asked for, for a training run this process starts."""
    env = dict(base)
    for var in _ASKED:
        if env.get(var) == _ONE:
            del env[var]
    return env
