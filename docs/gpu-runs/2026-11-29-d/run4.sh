#!/usr/bin/env bash
# Session d, run 4: the GPU suite on the final build.
set -uo pipefail
E2E_PRESETS=qwen3-4b ABLATIONS="PAGELLM_DISABLE_PDL=1 PAGELLM_MATMUL=cublaslt PAGELLM_DISABLE_QKV_FUSION=1 PAGELLM_DECODE_KERNEL=cpasync" \
  timeout 580 scripts/gpu_suite.sh gpu-bundle $OUT/logs tests bench ablate trace calib e2e > $OUT/suite.log 2>&1
echo "suite rc=$?"
grep -E "^===|PASSED|FAILED|^  decode |fraction|achieved|PASS|FAIL|worst" $OUT/suite.log | head -80
gzip -f $OUT/logs/trace_w1.csv 2>/dev/null
