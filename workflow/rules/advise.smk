# The loader advisor (docs/advisor.md), switched on by the config's `advisor` section:
# the interference map, the advice with its verification config and predictions, and
# predicted vs measured once the verification runs are in (for a calibrated advice, the blind
# check's table too).

# `advise` and `predicted_vs_measured` exist only when asked for: the verification config runs
# in the same results directory, and there advice/predictions.csv must stay the file its
# advice wrote, not be refitted by `advise` on the verification runs.

# The map, the advice and predicted vs measured read the merged tables for seconds: under Slurm
# they run where Snakemake runs, as summarize and compare do (analysis.smk). `share` measures.


localrules:
    interference_map,


rule interference_map:
    input:
        runs=PATHS.runs_table,
        steps=PATHS.steps_table,
    output:
        table=report(
            PATHS.map_table,
            caption="../report/interference_map.rst",
            category="Advisor",
        ),
        png=report(
            PATHS.figure(FigureName.INTERFERENCE_MAP),
            caption="../report/interference_map.rst",
            category="Advisor",
        ),
        pdf=PATHS.figure(FigureName.INTERFERENCE_MAP, "pdf"),
    log:
        PATHS.log("interference_map"),
    conda:
        CONDA_ENV
    threads: 1
    script:
        "../scripts/interference_map.py"


if ADVISOR.advise:

    localrules:
        advise,

    rule advise:
        input:
            runs=PATHS.runs_table,
            steps=PATHS.steps_table,
        output:
            text=report(
                PATHS.advice_text,
                caption="../report/advice.rst",
                category="Advisor",
            ),
            verify=PATHS.verify_config,
            predictions=PATHS.predictions_table,
        log:
            PATHS.log("advise"),
        conda:
            CONDA_ENV
        threads: 1
        script:
            "../scripts/advise.py"


if ADVISOR.predictions:

    localrules:
        predicted_vs_measured,

    rule predicted_vs_measured:
        input:
            predictions=ADVISOR.predictions,
            runs=PATHS.runs_table,
            steps=PATHS.steps_table,
        output:
            table=PATHS.predicted_vs_measured_table,
            png=report(
                PATHS.figure(FigureName.PREDICTED_VS_MEASURED),
                caption="../report/predicted_vs_measured.rst",
                category="Advisor",
            ),
            pdf=PATHS.figure(FigureName.PREDICTED_VS_MEASURED, "pdf"),
        log:
            PATHS.log("predicted_vs_measured"),
        conda:
            CONDA_ENV
        threads: 1
        script:
            "../scripts/predicted_vs_measured.py"


# A calibrated advice's verification (docs/advisor.md, "The blind check in the workflow"): the
# calibrate rule recorded the uncalibrated fit's predictions beside the calibrated ones before
# any of these runs; both are scored on them. The calibrated set is read, never written.
CALIBRATED_SET = (
    ResultPaths.calibrated_set_of(ADVISOR.predictions) if ADVISOR.predictions else None
)

if CALIBRATED_SET is not None:

    localrules:
        blind_error,

    rule blind_error:
        input:
            # What the calibrate rule recorded: the calibrated predictions' sha256 and time.
            verify=CALIBRATED_SET / PATHS.verify_config.relative_to(PATHS.set_dir),
            predictions=ADVISOR.predictions,
            uncalibrated=CALIBRATED_SET
            / PATHS.uncalibrated_predictions_table.relative_to(PATHS.set_dir),
            record=CALIBRATED_SET / PATHS.uncalibrated_record.relative_to(PATHS.set_dir),
            probe=ResultPaths.merged_tables_of(CALIBRATED_SET)[0],
            runs=PATHS.runs_table,
            steps=PATHS.steps_table,
        output:
            table=report(
                PATHS.blind_table,
                caption="../report/blind_error.rst",
                category="Advisor",
            ),
            summary=PATHS.blind_summary,
        log:
            PATHS.log("blind_error"),
        conda:
            CONDA_ENV
        threads: 1
        params:
            calibrated=CALIBRATED_SET,
            results=PATHS.set_dir,
        shell:
            '"$CODL_PYTHON" -m codl.cli check blind {params.calibrated:q} {params.results:q} '
            "--out {output.table:q} --summary {output.summary:q} > {log:q} 2>&1"


# Jobs sharing a node (section `share`): every split runs the jobs together on this machine,
# so the rule takes all of its cores, as a run does.
if config.get("share", {}).get("jobs"):

    rule share:
        input:
            datasets=SHARE_INPUTS,
        output:
            rows=PATHS.share_rows,
            table=report(
                PATHS.share_table,
                caption="../report/share.rst",
                category="Advisor",
            ),
            png=report(
                PATHS.figure(FigureName.SHARE),
                caption="../report/share.rst",
                category="Advisor",
            ),
            pdf=PATHS.figure(FigureName.SHARE, "pdf"),
        log:
            PATHS.log("share"),
        conda:
            CONDA_ENV
        threads: workflow.cores
        resources:
            nodes=SHARE_RESOURCES["nodes"],
            tasks=SHARE_RESOURCES["tasks"],
            cpus_per_task=SHARE_RESOURCES["cpus_per_task"],
            mem_mb=SHARE_RESOURCES["mem_mb"],
            runtime=SHARE_RESOURCES["runtime"],
            gpu=SHARE_RESOURCES["gpu"],
            tasks_per_gpu=SHARE_RESOURCES["tasks_per_gpu"],
            slurm_extra=SHARE_RESOURCES["slurm_extra"],
        params:
            set_name=PATHS.set_name,
        script:
            "../scripts/share.py"
