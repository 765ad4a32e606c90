import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.blas import one_blas_thread
from codl.log import configure

one_blas_thread()  # before numpy loads; see codl.blas
configure()

from codl.steps.analysis import figures_to

figures_to(
    runs_table=Path(snakemake.input.runs),
    steps_table=Path(snakemake.input.steps),
    comparison_table=Path(snakemake.input.comparison),
    decomposition_table=Path(snakemake.input.decomposition),
    api_calls=[Path(p) for p in snakemake.input.api_calls],
    timelines=[Path(p) for p in snakemake.input.timelines],
    figdir=Path(snakemake.output.component_durations).parent,
)
