# Summarize, compare and figures read a few files and write tables and figures in seconds: under
# Slurm they run where Snakemake runs (localrules) instead of waiting in the queue as one sbatch
# job each (one per run for summarize). `--local-cores` caps how many run there at once.


localrules:
    summarize,
    calls,
    all_calls,
    compare,
    figures,


rule summarize:
    input:
        trace=PATHS.trace("{run_id}"),
    output:
        steps=PATHS.steps("{run_id}"),
        summary=PATHS.summary("{run_id}"),
        attribution=PATHS.attribution("{run_id}"),
        parts=PATHS.parts("{run_id}"),
        api_calls=PATHS.api_calls("{run_id}"),
        timeline=PATHS.timeline("{run_id}"),
    log:
        PATHS.summarize_log("{run_id}"),
    conda:
        CONDA_ENV
    # One slot each: as many summarize jobs run at once as there are cores, and each decodes
    # on every core (chunked.default_threads), the OS sharing them. On 16 cores, 16 traces of
    # 10^8 events took 12.6 s so, 11.7 s with each job held to one core, 17.2 s as 4 jobs of
    # 4 cores; a lone trace 3.3 s, against 7.7 s on one core (one round each, one H200 allocation:
    # benchmarks/summarize_matrix.py).
    threads: 1
    script:
        "../scripts/summarize.py"


# Every CUDA runtime API call of a run, a row each: written only where asked (`snakemake
# all_calls`, or one run's calls.parquet as the target), as it grows with the calls (~0.4 GB
# per 7 x 10^7). No rule reads it; the summary has what its tables need.
rule calls:
    input:
        trace=PATHS.trace("{run_id}"),
    output:
        calls=PATHS.calls("{run_id}"),
    log:
        PATHS.calls_log("{run_id}"),
    conda:
        CONDA_ENV
    threads: 1
    script:
        "../scripts/calls.py"


rule all_calls:
    input:
        all_of("calls"),


rule compare:
    input:
        summaries=all_of("summary"),
        steps=all_of("steps"),
        attributions=all_of("attribution"),
        parts=all_of("parts"),
    output:
        runs=report(
            PATHS.runs_table,
            caption="../report/runs.rst",
            category="Tables",
        ),
        steps=PATHS.steps_table,
        comparison=report(
            PATHS.comparison_table,
            caption="../report/comparison.rst",
            category="Tables",
        ),
        attribution=report(
            PATHS.attribution_table,
            caption="../report/attribution.rst",
            category="Tables",
        ),
        decomposition=report(
            PATHS.decomposition_table,
            caption="../report/decomposition_table.rst",
            category="Tables",
        ),
    log:
        PATHS.log("compare"),
    conda:
        CONDA_ENV
    threads: 1
    script:
        "../scripts/compare.py"


# One report entry per figure, each with its own caption: PNGs only. The PDFs are the same
# figures for print; registering them too would list every figure twice in the report. Which
# figures, the plan's specs decide (get_figure_outputs): the outputs stay static.
rule figures:
    input:
        runs=PATHS.runs_table,
        steps=PATHS.steps_table,
        comparison=PATHS.comparison_table,
        decomposition=PATHS.decomposition_table,
        api_calls=all_of("api_calls"),
        timelines=all_of("timeline"),
    output:
        **get_figure_outputs(),
    log:
        PATHS.log("figures"),
    conda:
        CONDA_ENV
    threads: 1
    script:
        "../scripts/figures.py"


# With a `blocks` section: the planned blocks and which of them the tables hold, written after
# the runs it counts; its params change when an invocation adds blocks, so it is redone then.
if BLOCKS:

    localrules:
        block_progress,

    rule block_progress:
        input:
            traces=all_of("trace"),
        output:
            table=report(
                PATHS.blocks_table,
                caption="../report/blocks.rst",
                category="Tables",
            ),
        log:
            PATHS.log("block_progress"),
        conda:
            CONDA_ENV
        threads: 1
        params:
            rows=get_block_rows,
        script:
            "../scripts/block_progress.py"
