import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from codl.log import configure

configure()

from codl.steps.analysis import write_calls

write_calls(Path(snakemake.input.trace), Path(snakemake.output.calls))
