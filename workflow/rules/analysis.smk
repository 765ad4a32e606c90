# Summarize, compare and figures read a few files and write tables and figures in seconds: under
# Slurm they run where Snakemake runs (localrules) instead of waiting in the queue as one sbatch
# job each (one per run for summarize). `--local-cores` caps how many run there at once.


localrules:
    summarize,
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
    threads: 1
    script:
        "../scripts/summarize.py"


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
# figures for print; registering them too would list every figure twice in the report.
rule figures:
    input:
        runs=PATHS.runs_table,
        steps=PATHS.steps_table,
        comparison=PATHS.comparison_table,
        decomposition=PATHS.decomposition_table,
        api_calls=all_of("api_calls"),
        timelines=all_of("timeline"),
    output:
        component_durations=report(
            PATHS.figure("component_durations"),
            caption="../report/component_durations.rst",
            category="Figures",
            subcategory="Interference",
            labels={
                "figure": "component_durations",
                "shows": "isolation vs combined per component",
                "statistic": "p95, 95 % CI per bar",
            },
        ),
        policy_heatmap=report(
            PATHS.figure("policy_heatmap"),
            caption="../report/policy_heatmap.rst",
            category="Figures",
            subcategory="Interference",
            labels={
                "figure": "policy_heatmap",
                "shows": "throughput and compute inflation per policy x workers",
                "statistic": "median; p95 ratio, 95 % CI",
            },
        ),
        step_time_distributions=report(
            PATHS.figure("step_time_distributions"),
            caption="../report/step_time_distributions.rst",
            category="Figures",
            subcategory="Interference",
            labels={
                "figure": "step_time_distributions",
                "shows": "step-time distribution per mode and policy",
                "statistic": "quartiles, p1-p99",
            },
        ),
        launch_wait_vs_compute=report(
            PATHS.figure("launch_wait_vs_compute"),
            caption="../report/launch_wait_vs_compute.rst",
            category="Figures",
            subcategory="Mechanism",
            labels={
                "figure": "launch_wait_vs_compute",
                "shows": "launch-thread run-queue wait vs compute, per step",
                "statistic": "every step",
            },
        ),
        decomposition=report(
            PATHS.figure("decomposition"),
            caption="../report/decomposition.rst",
            category="Figures",
            subcategory="Mechanism",
            labels={
                "figure": "decomposition",
                "shows": "compute inflation and the parts that move with it",
                "statistic": "mean, all and slowest 5 % steps",
            },
        ),
        step_timeline=report(
            PATHS.figure("step_timeline"),
            caption="../report/step_timeline.rst",
            category="Figures",
            subcategory="Mechanism",
            labels={
                "figure": "step_timeline",
                "shows": "one representative step, every thread",
                "statistic": "one step",
            },
        ),
        api_latency_cdf=report(
            PATHS.figure("api_latency_cdf"),
            caption="../report/api_latency_cdf.rst",
            category="Figures",
            subcategory="Mechanism",
            labels={
                "figure": "api_latency_cdf",
                "shows": "CUDA runtime API call latency",
                "statistic": "empirical CDF",
            },
        ),
        pdfs=[str(PATHS.figure(name, "pdf")) for name in RUN_FIGURES],
    log:
        PATHS.log("figures"),
    conda:
        CONDA_ENV
    threads: 1
    script:
        "../scripts/figures.py"
