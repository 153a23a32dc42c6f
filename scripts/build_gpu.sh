#!/usr/bin/env bash
# Builds the CUDA binaries for the GPU machine into build-gpu/ (here, where the compilers
# and Debian's libraries are) and copies the shared libraries that machine lacks into
# build-gpu/lib, so that scripts/gpu_suite.sh needs no compiler or package there.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-gpu}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGELLM_CUDA=ON -DPAGELLM_STATIC_DEPS=ON >/dev/null
cmake --build "$B" -j2 --target pagellm_cli test_cuda $(cd "$B" && ninja -t targets all | grep -oE '^[a-z_]+_bench' | sort -u | tr '\n' ' ')
mkdir -p "$B/lib"
# Everything the binaries link that is neither glibc, the C++ runtime nor a CUDA library
# (those come from the GPU machine's own toolkit and driver).
for bin in "$B/pagellm" "$B/tests/test_cuda"; do
  ldd "$bin" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++*|libgcc_s*) ;;
      libcuda.so*|libcublas*|libcudnn*|libnccl*|libcudart*) ;;
      *) cp -uL "$lib" "$B/lib/" ;;
    esac
  done
done
# CUPTI, which `pagellm bench --trace-steps` loads at run time (so ldd does not list it).
cupti=$(find /usr/local/cuda/lib64/ /usr/local/cuda/extras/CUPTI/lib64/ -name 'libcupti.so.*' 2>/dev/null | sort | head -1 || true)
[ -n "$cupti" ] && cp -uL "$cupti" "$B/lib/libcupti.so.13"
# One compressed bundle of what the GPU machine runs (the device tool carries at most
# 64 MiB, and the statically linked binaries are about 30 MB each).
rm -rf gpu-bundle && mkdir -p gpu-bundle/stage/bin
cp "$B/pagellm" "$B/tests/test_cuda" gpu-bundle/stage/bin/
find "$B/bench" -maxdepth 1 -type f -perm -u+x -exec cp {} gpu-bundle/stage/bin/ \;
strip gpu-bundle/stage/bin/*
cp -r "$B/lib" gpu-bundle/stage/lib
tar -C gpu-bundle/stage -cf - bin lib | xz -T2 -6 > gpu-bundle/bundle.tar.xz
rm -rf gpu-bundle/stage
# The Python package as a cp312 wheel with the CUDA backend (the GPU machine's Python is
# 3.12 and has no compiler). scikit-build-core builds in build-wheel-<tag>, beside $B: ccache
# (base_dir /work) hashes paths relative to the build folder, so a folder at the same depth
# as build-gpu reuses its objects (build/wheel-<tag>, one level deeper, would miss them all).
# scripts/gpu_suite.sh's "python" step installs the wheel.
PY312=${PY312:-$HOME/.pyenv/versions/3.12.1/bin/python3}
"$PY312" -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt 2>&1 \
  | grep -v "Running pip as the 'root' user" || true
"$PY312" -m pip wheel . --no-deps --no-build-isolation -w gpu-bundle \
  -Cbuild-dir='build-wheel-{wheel_tag}' -Ccmake.define.PAGELLM_CUDA=ON \
  -Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -Ccmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache \
  -Ccmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache
# PEFT for the "lora" step's reference (scripts/lora_peft_check.py): the GPU machine has no
# network, so its wheel travels in the bundle with what peft needs that the machine lacks:
# accelerate (peft imports it at load) and psutil (accelerate's; a binary wheel for the
# machine's cp312). torch, transformers, safetensors, huggingface_hub, numpy, packaging,
# pyyaml and tqdm are there already. gpu_suite.sh installs them with --no-deps.
mkdir -p gpu-bundle/wheels
"$PY312" -m pip download -q --disable-pip-version-check --no-deps -d gpu-bundle/wheels peft accelerate
"$PY312" -m pip download -q --disable-pip-version-check --no-deps -d gpu-bundle/wheels \
  --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.12 psutil
ls -la gpu-bundle gpu-bundle/wheels
