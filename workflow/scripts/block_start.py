import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.blas import one_blas_thread
from codl.log import configure

one_blas_thread()  # before numpy loads; see codl.blas
configure()

from codl.steps.blocks import block_start_to

block_start_to(
    block=snakemake.wildcards.block,
    first=snakemake.params.first,
    deadline=snakemake.params.deadline,
    budget_s=snakemake.params.budget,
    out=Path(snakemake.output.record),
)
