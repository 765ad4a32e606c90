import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.blas import one_blas_thread
from codl.log import configure

one_blas_thread()  # before numpy loads; see codl.blas
configure()

from codl.steps.analysis import summarize_to

summarize_to(
    Path(snakemake.input.trace),
    steps=Path(snakemake.output.steps),
    summary=Path(snakemake.output.summary),
    attribution=Path(snakemake.output.attribution),
    parts=Path(snakemake.output.parts),
    api_calls=Path(snakemake.output.api_calls),
    timeline=Path(snakemake.output.timeline),
)
