#!/usr/bin/env bash
# Print `export` lines that cap the SIMD instruction set numpy, torch (ATen, oneDNN,
# MKL) and numba use, so a float32 tolerance that holds on one kind of CPU only
# fails on every machine. Usage:
#
#   eval "$(bash scripts/isa_env.sh avx2)"      # what an AMD Zen 3 (no AVX-512) runs
#   eval "$(bash scripts/isa_env.sh sse4)"      # x86-64-v2: no AVX at all
#   eval "$(bash scripts/isa_env.sh other)"     # a path this machine does not take by
#                                               # default: avx2 on AVX-512 hosts, else sse4
#
# Our machines are Intel (AVX-512) and AMD EPYC (AVX2): float32 sums round
# differently on each. scripts/test.sh runs the numeric suites a second time under
# `other`. MLX and vLLM's own compiled kernels have no such switch; their numbers
# still pass through numpy/torch/oneDNN where these variables apply.
set -euo pipefail
level=${1:-other}
if [ "$level" = other ]; then
  if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then level=avx2; else level=sse4; fi
fi
# numpy refuses to disable its baseline (SSE..SSE3); everything above is dispatched.
npy_avx512="AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"
case "$level" in
  avx2)
    npy="$npy_avx512"
    aten=avx2 onednn=AVX2 mkl=AVX2 numba=haswell
    ;;
  sse4)
    npy="AVX F16C FMA3 AVX2 $npy_avx512"
    aten=default onednn=SSE41 mkl=SSE4_2 numba=nehalem
    ;;
  *)
    echo "isa_env.sh: unknown level '$level' (use avx2, sse4 or other)" >&2
    exit 2
    ;;
esac
cat <<EOF
export GENLM_TEST_ISA=$level
export NPY_DISABLE_CPU_FEATURES="$npy"
export ATEN_CPU_CAPABILITY=$aten
export ONEDNN_MAX_CPU_ISA=$onednn
export MKL_ENABLE_INSTRUCTIONS=$mkl
export NUMBA_CPU_NAME=$numba
EOF
