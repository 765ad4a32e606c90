import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.blas import one_blas_thread
from codl.log import configure

one_blas_thread()  # before numpy loads; see codl.blas
configure()

from codl.advisor.settings import advisor_settings
from codl.steps.advisor import predicted_vs_measured_to

predicted_vs_measured_to(
    predictions=Path(snakemake.input.predictions),
    runs=Path(snakemake.input.runs),
    steps=Path(snakemake.input.steps),
    table=Path(snakemake.output.table),
    figures=[Path(snakemake.output.png), Path(snakemake.output.pdf)],
    planned_sha256=advisor_settings(snakemake.config).predictions_sha256,
    planned_at=advisor_settings(snakemake.config).predicted_at,
)
