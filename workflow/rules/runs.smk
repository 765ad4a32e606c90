# One job per run. Locally a run takes every core (threads: workflow.cores) so that nothing the
# experiment did not ask for (another run, a summarize job) shares its CPUs; on Slurm it becomes
# one job of `tasks` ranks (see profiles/slurm).


localrules:
    spec,


rule spec:
    output:
        spec=PATHS.spec("{run_id}"),
    log:
        PATHS.log("spec", "{run_id}"),
    conda:
        CONDA_ENV
    params:
        spec=get_spec_json,
    shell:
        '"$CODL_PYTHON" -m codl.cli write-spec {params.spec:q} --out {output.spec:q} > {log:q} 2>&1'


rule run:
    input:
        spec=PATHS.spec("{run_id}"),
        dataset=get_dataset_input,
        # With a `blocks` section: the previous run of the block (order), and the block as
        # one Slurm job (group).
        after=get_block_after,
    output:
        trace=PATHS.trace("{run_id}"),
    log:
        PATHS.run_log("{run_id}"),
    group:
        get_block_group
    conda:
        CONDA_ENV
    threads: workflow.cores
    resources:
        nodes=get_run_resource("nodes"),
        tasks=get_run_resource("tasks"),
        cpus_per_task=get_run_resource("cpus_per_task"),
        gpu=get_run_resource("gpu"),
        tasks_per_gpu=get_run_resource("tasks_per_gpu"),
        mpi=get_run_resource("mpi", missing=None),
        mem_mb=get_run_resource("mem_mb"),
        runtime=get_run_resource("runtime"),
    params:
        dataset=get_dataset_arg,
        kineto=str(PATHS.kineto_dir("{run_id}")),
    shell:
        '"$CODL_PYTHON" -m codl.cli run {input.spec:q} --trace {output.trace:q} {params.dataset} '
        "--kineto-dir {params.kineto:q} --cpus-per-task {resources.cpus_per_task} > {log:q} 2>&1"


# With `blocks.budget`: before each block not yet measured, in block order and after the one
# before it, whether the block starts (codl.steps.blocks.block_start_to): the first always, a
# later one while the budget lasts. A checkpoint, so that a block that does not start is left
# out of the DAG (its runs never run, the analysis holds the blocks that did) instead of
# failing the invocation; local, so that under Slurm the clock is the invocation's own.
if TO_START:

    localrules:
        block_start,

    checkpoint block_start:
        input:
            after=get_block_start_after,
        output:
            record=get_block_start_record("{block}"),
        log:
            PATHS.log("block_start", f"{BLOCK_START}-{{block}}"),
        conda:
            CONDA_ENV
        threads: 1
        params:
            first=get_block_start_first,
            deadline=DEADLINE,
            budget=BUDGET,
        script:
            "../scripts/block_start.py"
