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
  clang libclang-rt-14-dev libcpp-httplib-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# cpp-httplib for `pagellm serve`, header-only: Debian's libcpp-httplib-dev splits the header
# and puts the code in a shared library (linked to OpenSSL and Brotli) that the GPU machine
# does not have, so the single header of the same Debian release (its source package, with
# Debian's security patches applied) goes to /usr/local/include/pagellm-httplib.
httplib_dir=/usr/local/include/pagellm-httplib
if ! grep -qs "inline bool Server::listen_internal" "$httplib_dir/httplib.h"; then
  if ! grep -qrs "^Types:.*deb-src\|^deb-src" /etc/apt/sources.list.d/ /etc/apt/sources.list; then
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then  # deb822 (Debian 12's default)
      sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
        | $SUDO tee /etc/apt/sources.list.d/pagellm-deb-src.sources >/dev/null
    else
      sed -n 's/^deb /deb-src /p' /etc/apt/sources.list \
        | $SUDO tee /etc/apt/sources.list.d/pagellm-deb-src.list >/dev/null
    fi
  fi
  $SUDO apt-get update -qq
  work=$(mktemp -d)
  # The source of exactly the installed libcpp-httplib-dev (0.11.4 on Debian 12).
  version=$(dpkg-query -W -f='${Version}' libcpp-httplib-dev)
  (cd "$work" && apt-get source -qq --download-only "cpp-httplib=$version" >/dev/null 2>&1 \
    && tar xf cpp-httplib_*.orig.tar.* && tar xf cpp-httplib_*.debian.tar.* \
    && cd yhirose-cpp-httplib-* \
    && while read -r patch; do patch -s -p1 < "../debian/patches/$patch"; done < ../debian/patches/series \
    && $SUDO mkdir -p "$httplib_dir" && $SUDO cp httplib.h LICENSE "$httplib_dir/") \
    || echo "setup.sh: warning: could not fetch cpp-httplib's source package; pagellm serve will not be built" >&2
  rm -rf "$work"
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
# The server's tests: the real openai client from PyPI.
python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/../tests/server/requirements.txt" 2>&1 \
  | grep -v "Running pip as the 'root' user" || true
