import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.blas import one_blas_thread
from codl.log import configure

one_blas_thread()  # before numpy loads; see codl.blas
configure()

from codl.steps.pooled import pooled_to

pooled_to(
    traces=[Path(p) for p in snakemake.input.traces],
    summaries=[Path(p) for p in snakemake.input.summaries],
    steps=[Path(p) for p in snakemake.input.steps],
    decomposition=Path(snakemake.input.decomposition),
    runs_table=Path(snakemake.output.runs),
    inflation_table=Path(snakemake.output.inflation),
    throughput_table=Path(snakemake.output.throughput),
    efficiency_table=Path(snakemake.output.efficiency),
    figures=[Path(snakemake.output.figure), Path(snakemake.output.pdf)],
    efficiency_figures=[
        Path(snakemake.output.efficiency_figure),
        Path(snakemake.output.efficiency_pdf),
    ],
)
