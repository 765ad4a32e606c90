# Calibration on a new machine (docs/advisor.md): with `advisor.calibrate: FIT` the runs are
# FIT's probe of this machine (planned in common.smk from the committed fit), then the fit,
# calibrated on them, writes the advice, its verification config and predictions as one unit,
# and the uncalibrated fit's predictions of the same settings with their sha256 and time: both
# recorded before a later invocation runs the verification config, so that `codl check blind`
# can score them blind. Both rules read a few tables for seconds: under Slurm they run where
# Snakemake runs.

if ADVISOR.calibrate:

    localrules:
        probe_config,
        calibrate,

    # The probe config as `codl advise FIT --probe-out` writes it: the record of the probe, and
    # the check (in `calibrate`, --probe-config) that the runs planned are its runs.
    rule probe_config:
        input:
            fit=calibrate_inputs(config),
        output:
            probe=PATHS.probe_config,
        log:
            PATHS.log("probe_config"),
        conda:
            CONDA_ENV
        params:
            # The fit's results directory: its runs table's (tables/runs.csv) grandparent.
            fit=lambda wildcards, input: Path(input.fit[0]).parents[1],
            options=calibrate_options(config),
        shell:
            '"$CODL_PYTHON" -m codl.cli advise {params.fit:q} --boot 0 --probe-out {output.probe:q} '
            "{params.options} > {log:q} 2>&1"

    rule calibrate:
        input:
            fit=calibrate_inputs(config),
            probe=PATHS.probe_config,
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
            table=PATHS.calibration_table,
            uncalibrated=PATHS.uncalibrated_predictions_table,
            uncalibrated_record=PATHS.uncalibrated_record,
        log:
            PATHS.log("calibrate"),
        conda:
            CONDA_ENV
        params:
            fit=lambda wildcards, input: Path(input.fit[0]).parents[1],
            results=lambda wildcards, input: Path(input.runs).parents[1],
            options=calibrate_options(config),
            # The uncalibrated predictions are for the budget the calibrated advice is for.
            cores=f"--cores {ADVISOR.cores}" if ADVISOR.cores else "",
        shell:
            '("$CODL_PYTHON" -m codl.cli advise {params.fit:q} --calibrate {params.results:q} '
            "--probe-config {input.probe:q} --calibration-table {output.table:q} "
            "--out {output.verify:q} --predictions {output.predictions:q} "
            "--text {output.text:q} {params.options} && "
            '"$CODL_PYTHON" -m codl.cli check uncalibrated {params.fit:q} '
            "{output.predictions:q} --out {output.uncalibrated:q} "
            "--record {output.uncalibrated_record:q} {params.cores}) > {log:q} 2>&1"
