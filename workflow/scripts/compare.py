import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.blas import one_blas_thread
from codl.log import configure

one_blas_thread()  # before numpy loads; see codl.blas
configure()

from codl.steps.analysis import compare_to

compare_to(
    summaries=[Path(p) for p in snakemake.input.summaries],
    steps=[Path(p) for p in snakemake.input.steps],
    attributions=[Path(p) for p in snakemake.input.attributions],
    parts=[Path(p) for p in snakemake.input.parts],
    runs_table=Path(snakemake.output.runs),
    steps_table=Path(snakemake.output.steps),
    comparison_table=Path(snakemake.output.comparison),
    attribution_table=Path(snakemake.output.attribution),
    decomposition_table=Path(snakemake.output.decomposition),
)
