#!/usr/bin/env bash
# On the GPU machine: two builds of pagellm side by side on the LoRA decode figures
# (docs/PERFORMANCE.md, issue 19), in one call so that both see the same GPU and clocks.
#
#   scripts/ab_lora.sh DIR_A DIR_B LOGDIR [ROUNDS]
#
# DIR_A, DIR_B: folders holding a build's `pagellm` and `matmul_bench` (and, for B, `test_cuda`
# when B's LoRA tests should run first). Runs B's LoRA, skinny and batch-invariant GPU tests,
# then `matmul_bench --lora-only --lora-timeline` of A and of B, then ROUNDS (default 2)
# rounds of W1 (`pagellm bench --max-lora-rank 32 --lora-rank 32 --lora-adapters N
# --lora-compare`, N = 1 and 8) alternating A and B. Each command's output goes to LOGDIR;
# the summary lines (the layer row and each W1 "lora / base" line) to stdout. The shared
# libraries the binaries need must be on LD_LIBRARY_PATH (as scripts/gpu_suite.sh sets it).
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 DIR_A DIR_B LOGDIR [ROUNDS]" >&2
  exit 2
fi
A=$1 B=$2 LOG=$3 ROUNDS=${4:-2}
# shellcheck source=scripts/ab_common.sh
source "$(dirname "$0")/ab_common.sh"
ab_require_bins "$A $B" pagellm matmul_bench
mkdir -p "$LOG"
status=0
ab_gpu_tests "$B" "$LOG" "B: LoRA, skinny and batch-invariant tests" \
  '*Lora*:*LoRA*:*Skinny*:*BatchInvariant*' || status=1
for side in A B; do
  dir=$A
  [ "$side" = B ] && dir=$B
  echo "== $side: matmul_bench --lora-only --lora-timeline"
  timeout 300 "$dir/matmul_bench" --lora-only --lora-timeline > "$LOG/matmul_$side.log" 2>&1 \
    || status=1
  grep -E "^(op|qkv|o_proj|gate_up|down|layer) " "$LOG/matmul_$side.log"
done
for n in 1 8; do
  for round in $(seq 1 "$ROUNDS"); do
    for side in A B; do
      dir=$A
      [ "$side" = B ] && dir=$B
      out="$LOG/w1_${side}_n${n}_r${round}.log"
      timeout 300 "$dir/pagellm" bench --max-lora-rank 32 --lora-rank 32 --lora-adapters "$n" \
        --lora-compare > "$out" 2>&1 || status=1
      echo "$side, $n adapter(s), round $round: $(grep -m1 'lora / base' "$out" | sed 's/^ *//')"
    done
  done
done
exit $status
