import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.blas import one_blas_thread
from codl.log import configure

one_blas_thread()  # before numpy loads; see codl.blas
configure()

from codl.steps.slow_calls import slow_calls_to

slow_calls_to(
    traces=[Path(p) for p in snakemake.input.traces],
    twins=[Path(p) for p in snakemake.input.twins],
    table=Path(snakemake.output.table),
)
