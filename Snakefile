from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


# set_default=False: filling defaults into an experiment's `base` would override `defaults`;
# codl.config fills every default itself, from the same values (a test keeps them equal).
validate(config, "workflow/schemas/config.schema.yaml", set_default=False)


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/runs.smk"
include: "workflow/rules/analysis.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),
