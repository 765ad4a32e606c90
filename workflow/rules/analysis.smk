rule summarize:
    input:
        trace=PATHS.trace("{run_id}"),
    output:
        steps=PATHS.steps("{run_id}"),
        summary=PATHS.summary("{run_id}"),
        attribution=PATHS.attribution("{run_id}"),
        parts=PATHS.parts("{run_id}"),
    log:
        PATHS.summarize_log("{run_id}"),
    conda:
        "../../envs/codl.yaml"
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
        str(PATHS.logs / "compare.log"),
    conda:
        "../../envs/codl.yaml"
    threads: 1
    script:
        "../scripts/compare.py"


rule figures:
    input:
        runs=PATHS.runs_table,
        steps=PATHS.steps_table,
        comparison=PATHS.comparison_table,
        decomposition=PATHS.decomposition_table,
        traces=all_of("trace"),
    output:
        figures=report(
            expand(
                str(PATHS.figures / "{name}.{fmt}"),
                name=FIGURES,
                fmt=FIGURE_FORMATS,
            ),
            caption="../report/figures.rst",
            category="Figures",
        ),
        decomposition=report(
            expand(
                str(PATHS.figures / "{name}.{fmt}"),
                name=DECOMPOSITION_FIGURE,
                fmt=FIGURE_FORMATS,
            ),
            caption="../report/decomposition.rst",
            category="Figures",
        ),
    log:
        str(PATHS.logs / "figures.log"),
    conda:
        "../../envs/codl.yaml"
    threads: 1
    script:
        "../scripts/figures.py"
