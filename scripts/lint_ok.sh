#!/usr/bin/env bash
# Usage: lint_ok.sh RC LINT_OUTPUT: whether `snakemake --lint` (exit status RC, its output in
# the file LINT_OUTPUT) found nothing but the one lint codl expects.
#
# codl has no conda or container route (README, "Software environment": Snakemake could not
# create the old env file as written, and no conda channel was reachable to test a fixed one),
# so every rule gets "Specify a conda environment or container for each rule". That lint, and
# only that, is accepted; any other lint, or a lint run that failed without listing lints, fails.
set -u
rc=$1 out=$2
[ "$rc" -eq 0 ] && exit 0
expected='Specify a conda environment or container for each rule'
if ! grep -q '^Lints for rule ' "$out"; then
  echo "snakemake --lint failed (exit $rc) without listing lints" >&2; exit 1
fi
others=$(grep -E '^    \* ' "$out" | grep -v "$expected"; grep '^Lints for ' "$out" | grep -v '^Lints for rule ')
if [ -n "$others" ]; then
  printf 'snakemake --lint: unexpected lints:\n%s\n' "$others" >&2; exit 1
fi
