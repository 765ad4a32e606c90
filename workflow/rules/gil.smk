# Runs with the kernel's scheduler record (trace.sched_events): one row per run with its launch
# roles' sleeps by what ended them and its GIL wait per step (codl.steps.gil), the evidence the
# GIL intervention is read from. A few files in, seconds of work: local under Slurm (localrules).
# Its output is in the default target (get_final_outputs: codl.steps.workflow.gil_targets).

if SCHED_RUNS:

    localrules:
        launch_sleeps,

    rule launch_sleeps:
        input:
            traces=all_of("trace", SCHED_RUNS),
            summaries=all_of("summary", SCHED_RUNS),
            steps=all_of("steps", SCHED_RUNS),
        output:
            table=report(
                PATHS.gil_runs_table,
                caption="../report/gil_runs.rst",
                category="Tables",
            ),
        log:
            PATHS.log("launch_sleeps"),
        conda:
            CONDA_ENV
        threads: 1
        script:
            "../scripts/gil.py"
