# Runs with each CUDA call's scheduling evidence (trace.cuda_api_sched): every slow runtime API
# call, attributed against the run's compute twin (codl.steps.slow_calls). It reads the traces
# block by block (10^8 calls in ~50 s, docs/performance.md): local under Slurm (localrules).
# Its output is in the default target (get_final_outputs: codl.steps.slow_calls).

if SLOW_CALL_TWINS:

    localrules:
        slow_calls,

    rule slow_calls:
        input:
            traces=all_of("trace", list(SLOW_CALL_TWINS)),
            twins=all_of("trace", list(SLOW_CALL_TWINS.values())),
        output:
            table=report(
                PATHS.slow_calls_table,
                caption="../report/slow_calls.rst",
                category="Tables",
            ),
        log:
            PATHS.log("slow_calls"),
        conda:
            CONDA_ENV
        threads: 1
        script:
            "../scripts/slow_calls.py"
