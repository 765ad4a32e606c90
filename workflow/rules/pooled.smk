# With a `blocks` section: the block experiment pooled over its blocks (codl.steps.pooled): per
# run its launch roles' sleeps, per loading setting the compute inflation over blocks (each run
# beside the twin of its own block), the ring hand-off over the best torch setting of its block,
# the pipeline efficiency against the roofline of each block (data alone and compute alone of
# that block: the experiment's `mode` factor lists `data`), and the two figures. A few files in, seconds of work: local under Slurm (localrules).
# Its outputs are in the default target (get_final_outputs: codl.steps.workflow.pooled_targets).

if BLOCKS:

    localrules:
        pooled,

    rule pooled:
        input:
            traces=all_of("trace"),
            summaries=all_of("summary"),
            steps=all_of("steps"),
            decomposition=PATHS.decomposition_table,
        output:
            runs=PATHS.pooled_runs_table,
            inflation=report(
                PATHS.pooled_inflation_table,
                caption="../report/pooled_inflation.rst",
                category="Tables",
            ),
            throughput=report(
                PATHS.pooled_throughput_table,
                caption="../report/pooled_throughput.rst",
                category="Tables",
            ),
            figure=report(
                PATHS.intervention_figure("png"),
                caption="../report/intervention.rst",
                category="Figures",
                labels={
                    "figure": "intervention",
                    "shows": "compute inflation per loading setting, a point per block",
                    "statistic": "geometric mean over blocks, 95 % t interval",
                },
            ),
            pdf=PATHS.intervention_figure("pdf"),
            efficiency=report(
                PATHS.pooled_efficiency_table,
                caption="../report/pooled_efficiency.rst",
                category="Tables",
            ),
            efficiency_figure=report(
                PATHS.efficiency_figure("png"),
                caption="../report/efficiency.rst",
                category="Figures",
                labels={
                    "figure": "efficiency",
                    "shows": "throughput over the roofline per loading setting, a point per block",
                    "statistic": "geometric mean over blocks, 95 % t interval; parts: means",
                },
            ),
            efficiency_pdf=PATHS.efficiency_figure("pdf"),
        log:
            PATHS.log("pooled"),
        conda:
            CONDA_ENV
        threads: 1
        script:
            "../scripts/pooled.py"


# A config named `<set>/<invocation>` is one invocation of a set measured over several (nodes,
# allocations, days): its per-run table and those the set's other invocations left in
# results/<set>/<other>/tables/ pooled into results/<set>/tables/ (codl.steps.levels), each
# invocation's blocks its own and the invocation a level. Defined once another invocation's
# table is there.
if BLOCKS and INVOCATION_TABLES:

    localrules:
        pool_invocations,

    rule pool_invocations:
        input:
            own=PATHS.pooled_runs_table,
            others=INVOCATION_TABLES,
        output:
            inflation=PARENT.pooled_inflation_table,
            throughput=PARENT.pooled_throughput_table,
            levels=report(
                PARENT.pooled_levels_table,
                caption="../report/pooled_levels.rst",
                category="Tables",
            ),
        log:
            PATHS.log("pool_invocations"),
        conda:
            CONDA_ENV
        threads: 1
        script:
            "../scripts/pool_invocations.py"
