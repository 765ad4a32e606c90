#!/usr/bin/env bash
# End-to-end check of the test cluster and profiles/slurm: starts the cluster, runs a two-rule
# workflow through snakemake-executor-plugin-slurm, and checks that sacct reports every job it
# submitted as COMPLETED. Needs root (cluster.sh does). Exit status 0 on success.
#
#   tests/slurm/smoke_job.sh            # SNAKEMAKE=... to use another snakemake
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
STATE=${CODL_SLURM_STATE:-/tmp/codl-slurm}
if [[ -z ${SNAKEMAKE:-} ]]; then
    if [[ -x $REPO/.venv/bin/snakemake ]]; then SNAKEMAKE=$REPO/.venv/bin/snakemake; else SNAKEMAKE=snakemake; fi
fi

"$HERE/cluster.sh" up
# shellcheck source=/dev/null
source "$STATE/env.sh"

WORK=$(mktemp -d /tmp/codl-smoke.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/Snakefile" <<'EOF'
rule all:
    input:
        "sum.txt",


rule host:
    output:
        "host.txt",
    log:
        "logs/host.log",
    threads: 1
    shell:
        "(hostname; echo job=$SLURM_JOB_ID) > {output} 2> {log}"


rule sum:
    input:
        "host.txt",
    output:
        "sum.txt",
    log:
        "logs/sum.log",
    threads: 2
    shell:
        "(cat {input}; nproc) > {output} 2> {log}"
EOF

# No `--default-resources` here: it would replace the profile's whole mapping (mem_mb, runtime);
# partition and account reach the profile through CODL_SLURM_* from env.sh.
cd "$WORK"
start=$SECONDS
if ! timeout 600 "$SNAKEMAKE" --profile "$REPO/profiles/slurm" -j 2 >snakemake.log 2>&1; then
    cat snakemake.log >&2
    echo "smoke_job.sh: snakemake failed" >&2
    exit 1
fi
echo "smoke_job.sh: workflow finished in $((SECONDS - start)) s"

mapfile -t ids < <(sed -n 's/.*submitted with SLURM jobid \([0-9]*\).*/\1/p' snakemake.log)
if ((${#ids[@]} != 2)); then
    cat snakemake.log >&2
    echo "smoke_job.sh: expected 2 Slurm jobs, found ${#ids[@]}" >&2
    exit 1
fi
# -X: the allocation only, not its steps (batch, 0, ...).
states=$(sacct -X -n -P -j "$(IFS=,; echo "${ids[*]}")" -o JobID,State,Account,Partition)
echo "$states"
if grep -qv '|COMPLETED|' <<<"$states"; then
    echo "smoke_job.sh: not every job COMPLETED" >&2
    exit 1
fi
echo "smoke_job.sh: OK (jobs ${ids[*]})"
