"""One OpenBLAS thread for the commands that read traces and tables.

numpy's OpenBLAS starts a thread per core when numpy is imported, and each spins for work
for a while before it sleeps. The analysis (summarize, inspect, compare, the figures, the
advisor) multiplies no matrix large enough to want them, and on the 16-core H200 node those
threads cost every `codl summarize` 1.7-1.9 CPU-seconds at start for no wall time (10^6
events: 3.9 CPU-s against 2.0; 10^8: 22.0 against 20.2; `docs/performance.md`), CPU a
matrix's summarize jobs take from one another. ``codl run`` keeps the default: on a
CPU-only aarch64 machine torch's own CPU compute is OpenBLAS's.
"""

from __future__ import annotations

import os
import sys

BLAS_THREADS_VAR = "OPENBLAS_NUM_THREADS"


def one_blas_thread() -> None:
    """Ask OpenBLAS for one thread in this process (and the processes it starts), where the
    user has not chosen a count. Nothing once numpy is imported: OpenBLAS reads the variable
    when it loads, and a process that set it later would only pass it to its children."""
    if "numpy" not in sys.modules:
        os.environ.setdefault(BLAS_THREADS_VAR, "1")
