"""What one Snakemake rule or one ``codl`` command calls: read files, call the pure stages
(analysis, advisor, figures), write the outputs. The top floor: nothing below imports it.

The package itself imports nothing, so that the Snakefile's helpers (``steps.workflow``) load
without pandas or matplotlib at every parse.
"""
