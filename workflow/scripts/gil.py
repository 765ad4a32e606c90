import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.blas import one_blas_thread
from codl.log import configure

one_blas_thread()  # before numpy loads; see codl.blas
configure()

from codl.steps.gil import gil_runs_to

gil_runs_to(
    traces=[Path(p) for p in snakemake.input.traces],
    summaries=[Path(p) for p in snakemake.input.summaries],
    steps=[Path(p) for p in snakemake.input.steps],
    table=Path(snakemake.output.table),
)
