import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.blas import one_blas_thread
from codl.log import configure

one_blas_thread()  # before numpy loads; see codl.blas
configure()

from codl.steps.advisor import map_to

map_to(
    runs=Path(snakemake.input.runs),
    steps=Path(snakemake.input.steps),
    cfg=snakemake.config,
    table=Path(snakemake.output.table),
    figures=[Path(snakemake.output.png), Path(snakemake.output.pdf)],
)
