#!/usr/bin/env bash
# What a GPU machine that can fetch nothing needs to run scripts/gpu_check.sh (docs/gpu.md),
# built here into an ignored folder (default .gpu-bundle/) that travels with the checkout:
#
#   wheels/  genlm-core and its plugins (pip wheel --no-deps, from this checkout)
#   deps/    the dependencies such a machine lacks (a torch + transformers host with
#            numpy, numba, pytest, hypothesis, psutil, prometheus-client, httpx): pydantic,
#            pydantic-core, starlette, uvicorn, pytest-asyncio, ... at this venv's versions,
#            downloaded for CPython 3.12 on manylinux x86_64 (--python-version/--platform)
#   anchor/  genlm-backend 0.3.1 and accelerate (--no-deps): the reference of SIS against
#            genlm-backend, installed apart (gpu_check.sh --bundle) and used where it imports
#   models/smollm2-135m/  SmolLM2-135M's config.json and tokenizer (no weights: the models
#            are built there with random weights, scripts/gpu_models.py)
#
# Fails when the bundle exceeds 48 MiB (a lent machine carries 64 MiB in all).
#
#   scripts/gpu_bundle.sh                    # .gpu-bundle/, for CPython 3.12
#   PYVER=3.11 scripts/gpu_bundle.sh DIR     # another folder, another Python
#   NO_ANCHOR=1 scripts/gpu_bundle.sh        # without genlm-backend's wheels
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.gpu-bundle}
PYVER=${PYVER:-3.12}
PY=${PYTHON:-.venv/bin/python}
LIMIT_MB=48
DEPS=(pydantic pydantic-core annotated-types typing-inspection typing-extensions pluggy starlette uvicorn
      h11 click anyio sniffio idna pytest-asyncio)
ANCHOR=(genlm-backend==0.3.1 accelerate==1.15.0)
PLUGINS=(plugins/genlm_hf plugins/genlm_remote plugins/genlm_compat plugins/genlm_mock plugins/genlm_llamacpp
         plugins/genlm_vllm plugins/genlm_mlx)

rm -rf "$OUT"
mkdir -p "$OUT/wheels" "$OUT/deps" "$OUT/anchor" "$OUT/models"
echo "[gpu_bundle] wheels of genlm-core and its plugins"
$PY -m pip wheel --quiet --no-deps --no-build-isolation -w "$OUT/wheels" . "${PLUGINS[@]}"

pins=()
for name in "${DEPS[@]}"; do
  if v=$($PY -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name" 2>/dev/null); then
    pins+=("$name==$v")
  else
    echo "[gpu_bundle] $name is not installed here: left out" >&2
  fi
done
download=($PY -m pip download --quiet --no-deps --only-binary=:all: --implementation cp
          --python-version "$PYVER" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64)
echo "[gpu_bundle] dependencies for CPython $PYVER: ${pins[*]}"
"${download[@]}" -d "$OUT/deps" "${pins[@]}"
if [ -z "${NO_ANCHOR:-}" ]; then
  echo "[gpu_bundle] the SIS reference: ${ANCHOR[*]}"
  "${download[@]}" -d "$OUT/anchor" "${ANCHOR[@]}" \
    || echo "[gpu_bundle] the reference's wheels could not be downloaded: SIS will run without it" >&2
fi
echo "[gpu_bundle] SmolLM2-135M's config and tokenizer"
$PY scripts/gpu_models.py --export-config "$OUT/models/smollm2-135m" >/dev/null

bytes=$(du -sb "$OUT" | cut -f1)
mb=$(( (bytes + 1048575) / 1048576 ))
echo "[gpu_bundle] $OUT: $mb MiB ($(find "$OUT" -name '*.whl' | wc -l) wheels)"
if [ "$mb" -gt "$LIMIT_MB" ]; then
  echo "[gpu_bundle] $OUT is over $LIMIT_MB MiB: a lent machine carries 64 MiB in all" >&2
  exit 1
fi
echo "[gpu_bundle] on the GPU machine (carry $OUT): PYTHON=python3 scripts/gpu_check.sh --bundle $OUT"
