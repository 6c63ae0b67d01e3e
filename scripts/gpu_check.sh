#!/usr/bin/env bash
# The GPU check (docs/gpu.md): on a machine with an NVIDIA GPU, the `cuda` tests, the
# defect catalogue (every rows check fails on every defect; the models' rows depend on
# their context) and the GPU benchmarks (hf step, burst, SIS - against genlm-backend 0.3.1 where its reference
# stack is importable - and serve) on models built offline from a config with random
# weights (SmolLM2-135M float32, SmolLM2-1.7B's shape bfloat16; scripts/gpu_models.py),
# in under 8 minutes on an H100 (a 450 s budget; --budget S changes it). Writes each
# benchmark's JSON and Markdown, the tests' junit XML, summary.md and check.json into
# benchmarks/results/gpu/<device>/ (e.g. nvidia-h100-80gb-hbm3). Exits 2 without CUDA,
# 1 when a step failed or ran out of the budget.
#
#   scripts/gpu_check.sh                     # in a checkout with genlm-core installed
#   scripts/gpu_check.sh --bundle .gpu-bundle  # a machine without the dependencies:
#                                            # installs scripts/gpu_bundle.sh's wheels first
#   scripts/gpu_check.sh --dry-run-cpu       # the same steps on the CPU, tiny model (a check
#                                            # of the script; results in build/gpu-check-dry-run/)
#
# Options after these go to scripts/gpu_check.py (--out DIR, --models-dir DIR, --budget S,
# --skip NAME...: the tests or benchmark runs by name). The interpreter: $PYTHON, else .venv/bin/python,
# else python3. SIS against genlm-backend: $GENLM_ANCHOR_PYTHON (an interpreter with
# genlm-backend==0.3.1; default: the same one) and $GENLM_ANCHOR_PYTHONPATH (its site
# folder; --bundle sets it to the bundle's anchor wheels, installed apart from genlm-compat,
# which provides genlm.backend names too).
#
# A machine that can fetch nothing (a lent GPU): build the bundle here with
# scripts/gpu_bundle.sh, carry .gpu-bundle/ with the checkout, then run
#   PYTHON=python3 scripts/gpu_check.sh --bundle .gpu-bundle
set -euo pipefail
started=$(date +%s)
cd "$(dirname "$0")/.."

bundle=""
dry=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --bundle=*) bundle=${1#--bundle=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) [ "$1" = --dry-run-cpu ] && dry=1; args+=("$1"); shift ;;
  esac
done

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi

if [ -n "$bundle" ]; then
  [ -d "$bundle/wheels" ] || { echo "gpu_check: $bundle/wheels not found (build it with scripts/gpu_bundle.sh)" >&2; exit 2; }
  site=${GENLM_GPU_SITE:-/tmp/genlm-gpu-site}
  echo "[gpu_check] installing $bundle's wheels into $site (no index, no dependencies)"
  shopt -s nullglob
  $PY -m pip install --quiet --no-index --no-deps --upgrade --target "$site" "$bundle"/wheels/*.whl "$bundle"/deps/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  anchor=("$bundle"/anchor/*.whl)
  if [ ${#anchor[@]} -gt 0 ]; then
    # apart from $site: genlm-compat (in $site) provides genlm.backend names too
    $PY -m pip install --quiet --no-index --no-deps --upgrade --target "$site-anchor" "${anchor[@]}" \
      && export GENLM_ANCHOR_PYTHONPATH=${GENLM_ANCHOR_PYTHONPATH:-$site-anchor}
  fi
  shopt -u nullglob
  if [ -f "$bundle/models/smollm2-135m/config.json" ]; then
    GENLM_GPU_SOURCE=${GENLM_GPU_SOURCE:-$(cd "$bundle/models/smollm2-135m" && pwd)}
    export GENLM_GPU_SOURCE
  fi
fi

if [ $dry -eq 0 ] && ! $PY -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no GPU found: no CUDA device here ($PY: torch $($PY -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo 'not importable'))." >&2
  echo "gpu_check: run it on a machine with an NVIDIA GPU, or pass --dry-run-cpu to check the script on the CPU." >&2
  exit 2
fi

exec "$PY" scripts/gpu_check.py --started "$started" ${args[@]+"${args[@]}"}
