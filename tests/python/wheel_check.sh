#!/usr/bin/env bash
# The full `pip install .` check: builds the wheel CPU-only from the source tree (build
# folder and wheel inside BINARY_DIR), installs it into a temporary --target folder and
# generates with it from outside both trees. Registered as ctest python_wheel_full (on by
# default, -DPAGELLM_TEST_WHEEL=OFF drops it): it rebuilds the whole CPU library (8m18s
# wall, 6m46s of CPU, on the shared 2-core development machine with Python 3.12), which CI's
# 90 minutes can afford; test_install.py's quick check of the installed files runs as well.
# PYTHON picks the interpreter (default python3).
# Usage: wheel_check.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
SRC=$1
BIN=$2
PY=${PYTHON:-python3}
OUT="$BIN/wheel-check"
rm -rf "$OUT/dist" "$OUT/site" "$OUT/run"
mkdir -p "$OUT/dist" "$OUT/run"
start=$(date +%s)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache -Ccmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache)
fi
(cd "$SRC" && "$PY" -m pip wheel . --no-deps --no-build-isolation -w "$OUT/dist" \
  -Cbuild-dir="$OUT/build" -Ccmake.define.PAGELLM_CUDA=OFF -Ccmake.define.PAGELLM_TESTS=OFF \
  -Ccmake.define.PAGELLM_BENCH=OFF "${launcher[@]}")
"$PY" -m pip install --no-index --no-deps --target "$OUT/site" "$OUT"/dist/pagellm-*.whl
cd "$OUT/run"
PYTHONPATH="$OUT/site" "$PY" - <<PYEOF
import sys
import pagellm
assert pagellm.__file__.startswith("$OUT/site"), pagellm.__file__
assert "torch" not in sys.modules
model = pagellm.make_model("$OUT/run/tiny")
llm = pagellm.LLM(model, backend="cpu", kv_cache_gb=0.02)
out = llm.generate(["wheel"], pagellm.SamplingParams(max_tokens=4, seed=3), use_tqdm=False)
assert len(out[0].outputs[0].token_ids) == 4
print("wheel ok:", pagellm.__version__)
PYEOF
echo "wheel build + install + run: $(( $(date +%s) - start )) s"
