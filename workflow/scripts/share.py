import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.blas import one_blas_thread
from codl.log import configure

one_blas_thread()  # before numpy loads; see codl.blas
configure()

from codl.paths import ResultPaths
from codl.steps.share import share_to

share_to(
    snakemake.config,
    paths=ResultPaths(set_name=snakemake.params.set_name),
    rows_out=Path(snakemake.output.rows),
    table_out=Path(snakemake.output.table),
    figures=[Path(snakemake.output.png), Path(snakemake.output.pdf)],
)
