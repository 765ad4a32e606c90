# Data sets are generated once per name into resources/datasets/<name>/ and, for runs that read
# from another storage tier (node-local disk, /dev/shm), copied there; the copy's marker lives
# in resources/staged/ so the tier directory itself can be anywhere.


rule dataset:
    output:
        manifest=PATHS.dataset_manifest("{dataset}"),
    log:
        PATHS.log("dataset", "{dataset}"),
    conda:
        CONDA_ENV
    threads: 1
    params:
        spec=get_dataset_spec_json,
        out=get_dataset_out_dir,
    shell:
        '"$CODL_PYTHON" -m codl.cli dataset --spec-json {params.spec:q} --out {params.out:q} > {log:q} 2>&1'


rule stage_dataset:
    input:
        manifest=PATHS.dataset_manifest("{dataset}"),
    output:
        marker=PATHS.staged_marker("{tier}", "{dataset}"),
    log:
        PATHS.log("stage", "{tier}-{dataset}"),
    conda:
        CONDA_ENV
    threads: 1
    params:
        target=get_tier_target,
    shell:
        '"$CODL_PYTHON" -m codl.cli stage {input.manifest:q} --to {params.target:q} --marker {output.marker:q} > {log:q} 2>&1'
