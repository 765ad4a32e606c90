#!/usr/bin/env bash
# Run CoDL on a GPU node that has PyTorch/CUDA but no Snakemake (the H200 node we had):
# wheels carried in .whl/ are installed to /tmp/site, the package is used from src/, and `codl`
# is a shim on PATH. Usage: scripts/h200.sh setup|tests|overhead|apicost|harness|reproduce CONFIG
#   scripts/h200.sh reproduce CONFIG  the workflow on CONFIG (`snakemake --profile profiles/local`),
#       then its report. A config with a `blocks` section runs its blocks, `blocks.per_invocation`
#       at a time: call it again for the next ones (config/README.md, "Blocks").
#   scripts/h200.sh pack CONFIG [RUN_ID...]   tars every finished run's spec + trace (+ the
#       data-set manifest) of the config (or of the runs named) into $OUT/runs.tar.part-* (15 MiB
#       pieces, for a machine that returns files of <= 16 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/tmp/codl-bin:/tmp/site/bin:$PATH"
OUT="${OUT:-$PWD/out}"
export CODL_CACHE_DIR="${CODL_CACHE_DIR:-/tmp/codl-cache}"

setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  # Byte-compiled once, as an install does: the node sets PYTHONDONTWRITEBYTECODE, so every
  # codl process would otherwise compile these modules anew (~0.1 s a command).
  python3 -m compileall -q /tmp/site src >/dev/null
  mkdir -p /tmp/codl-bin
  printf '#!/bin/sh\nexec python3 -m codl.cli "$@"\n' > /tmp/codl-bin/codl
  printf '#!/bin/sh\nexec python3 -m snakemake "$@"\n' > /tmp/codl-bin/snakemake
  chmod +x /tmp/codl-bin/codl /tmp/codl-bin/snakemake
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
  python3 -c 'import torch, torchvision, snakemake, submitit; print("torch", torch.__version__, "cuda", torch.version.cuda, "tv", torchvision.__version__, "snakemake", snakemake.__version__, "gpus", torch.cuda.device_count())'
  nproc; lscpu | grep -E "Model name|NUMA|Socket|Thread|Core" || true
}

plan_ids() {  # the config's run ids in plan order
  codl plan "$1" | awk -F'run_id=' 'NF>1 {split($2, a, " "); print a[1]}'
}

case "${1:-}" in
  setup) setup ;;
  tests)
    python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_harness.py \
      tests/test_pinning.py -x 2>&1 | tail -15 ;;
  overhead)
    shift
    (cd benchmarks && python3 tracer_overhead.py --device cuda "$@") ;;
  apicost)
    shift
    (cd benchmarks && python3 launch_api_cost.py "$@") ;;
  harness)
    shift
    (cd benchmarks && python3 harness_overhead.py --device cuda "$@") ;;
  reproduce)
    cfg="${2:-config/config.yaml}"
    snakemake --profile profiles/local --configfile "$cfg" --cores all
    snakemake --profile profiles/local --configfile "$cfg" --report results/report.html ;;
  pack)
    cfg="$2"; shift 2
    if [ $# -gt 0 ]; then ids="$*"; else ids=$(plan_ids "$cfg"); fi
    files=$(for id in $ids; do if [ -f "results/runs/$id/trace.h5" ]; then
      echo "results/runs/$id/spec.json results/runs/$id/trace.h5 logs/run/$id.log"; fi; done)
    # shellcheck disable=SC2086
    tar -cf - $files resources/datasets/*/MANIFEST.json | split -b 15M - "$OUT/runs.tar.part-"
    ls -la "$OUT" ;;
  *) echo "usage: $0 setup|tests|overhead ARGS|apicost ARGS|harness ARGS|reproduce [CONFIG]|pack CONFIG [ID...]" >&2; exit 2 ;;
esac
