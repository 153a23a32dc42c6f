#!/usr/bin/env bash
# On the GPU machine: the Hopper prefill kernel's grid order in engine prefills (issue 20),
# one build, one call, so that every variant sees the same GPU, clocks and host.
#
#   scripts/ab_prefill_order.sh DIR LOGDIR [ROUNDS] ["SHAPES ..."]
#
# DIR: a folder holding `pagellm` (and optionally `test_cuda`, whose prefill attention tests
# run first: every case through every variant, NaN-poisoned outputs, against the CPU
# reference). Then ROUNDS (default 2) rounds of `pagellm bench --batch B --prompt-len L
# --output-len 2` for each SHAPE "BxL" (default: 16x2048 4x8192 1x16384 2x16384 1x32768)
# with PAGELLM_PREFILL_KERNEL = wgmma-headmajor, wgmma-kvmajor and wgmma (the size rule,
# prefill_grid_kv_major) in turn. The engine, not attention_bench, judges the order: the
# benchmark's back-to-back launches over the same pools probably find K/V warm in L2,
# which the engine's layers (another pool each) do not. Each command's output goes to
# LOGDIR, the prefill lines to stdout. The binaries' shared libraries must be on
# LD_LIBRARY_PATH (as scripts/gpu_suite.sh sets it).
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 DIR LOGDIR [ROUNDS] [\"SHAPES ...\"]" >&2
  exit 2
fi
DIR=$1 LOG=$2 ROUNDS=${3:-2} SHAPES=${4:-"16x2048 4x8192 1x16384 2x16384 1x32768"}
# shellcheck source=scripts/ab_common.sh
source "$(dirname "$0")/ab_common.sh"
ab_require_bins "$DIR" pagellm
mkdir -p "$LOG"
status=0
ab_gpu_tests "$DIR" "$LOG" "prefill attention GPU tests (every variant)" \
  'PagedAttention.Prefill*:PagedAttentionPlan.*:CudaSettings.*' || status=1
for round in $(seq 1 "$ROUNDS"); do
  for shape in $SHAPES; do
    batch=${shape%x*} len=${shape#*x}
    for kernel in wgmma-headmajor wgmma-kvmajor wgmma; do
      out="$LOG/prefill_${kernel}_${shape}_r${round}.log"
      PAGELLM_PREFILL_KERNEL=$kernel timeout 300 "$DIR/pagellm" bench --batch "$batch" \
        --prompt-len "$len" --output-len 2 > "$out" 2>&1 || status=1
      printf '%-16s %8s round %s: %s\n' "$kernel" "$shape" "$round" \
        "$(grep -E '^  prefill ' "$out" | tr -s ' ')"
    done
  done
done
exit $status
