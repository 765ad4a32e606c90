import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.blas import one_blas_thread
from codl.log import configure

one_blas_thread()  # before numpy loads; see codl.blas
configure()

from codl.steps.advisor import advise_to

# advice.txt: what `codl advise` prints first (the advice, its gain, the verification command),
# then the model's details, which the record keeps (steps.advisor.advice_record says why).
advise_to(
    runs=Path(snakemake.input.runs),
    steps=Path(snakemake.input.steps),
    cfg=snakemake.config,
    text=Path(snakemake.output.text),
    verify=Path(snakemake.output.verify),
    predictions=Path(snakemake.output.predictions),
)
