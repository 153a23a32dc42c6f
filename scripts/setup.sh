#!/usr/bin/env bash
# Installs what pagellm needs to build and test on a fresh Debian 12 machine:
# compilers and libraries from Debian (clang and its compiler-rt for the libFuzzer targets),
# Python packages for the parity tests from PyPI.
# The CUDA toolkit (nvcc, cuBLASLt, cuDNN, NCCL) is expected under /usr/local/cuda when
# the CUDA backend is wanted; without it the CPU-only build is made.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

packages=(build-essential cmake ninja-build pkg-config git python3 python3-pip
  nlohmann-json3-dev libcli11-dev libopenblas-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev gfortran
  clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python side: tokenizer and chat-template parity tests (no torch needed).
python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/../tests/oracles/requirements.txt" 2>&1 \
  | grep -v "Running pip as the 'root' user" || true
# The Python package: its build (nanobind, scikit-build-core) and its tests (pytest, tqdm, numpy).
python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/../tests/python/requirements.txt" 2>&1 \
  | grep -v "Running pip as the 'root' user" || true
# cuDNN attention route: the header-only cudnn-frontend, pinned, without its Python
# dependencies (CUTLASS DSL, TVM FFI: not needed for the C++ headers).
python3 -m pip install -q --disable-pip-version-check --no-deps nvidia-cudnn-frontend==1.32.0 2>&1 \
  | grep -v "Running pip as the 'root' user" || true
