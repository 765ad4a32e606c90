import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.blas import one_blas_thread
from codl.log import configure

one_blas_thread()  # before numpy loads; see codl.blas
configure()

from codl.steps.levels import invocations_to

invocations_to(
    sorted([Path(snakemake.input.own), *(Path(p) for p in snakemake.input.others)]),
    inflation_table=Path(snakemake.output.inflation),
    throughput_table=Path(snakemake.output.throughput),
    levels_table=Path(snakemake.output.levels),
)
