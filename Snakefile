from snakemake.utils import min_version, validate

min_version("9.0")


# The paper reproduction is the default config. A config given with --configfile replaces it
# instead of being deep-merged into it: a merge would leak GPU settings (bf16, 1000 classes,
# pinned memory) into every key the smaller config leaves unset.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# common.smk first: it plans the config with codl's own loader and checks, whose messages name
# the key and the fix; Snakemake's validate would print the whole 60 KB schema for one typo.
include: "workflow/rules/common.smk"


# set_default=False: filling defaults into an experiment's `base` would override `defaults`;
# codl.config fills every default itself, from the same values (a test keeps them equal).
validate(config, "workflow/schemas/config.schema.yaml", set_default=False)


include: "workflow/rules/data.smk"
include: "workflow/rules/runs.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/advise.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),
