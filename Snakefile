from snakemake.utils import min_version, validate


min_version("9.0")


configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/runs.smk"
include: "workflow/rules/analysis.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),
