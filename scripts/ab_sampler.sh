#!/usr/bin/env bash
# On the GPU machine: two builds of pagellm side by side on the GPU sampler's figures
# (docs/PERFORMANCE.md, "The GPU sampler by row count"), in one call so that both see the
# same GPU and clocks.
#
#   scripts/ab_sampler.sh DIR_A DIR_B LOGDIR [ROUNDS]
#
# DIR_A, DIR_B: folders holding a build's `pagellm` and `gpu_sampler_bench` (and, for B,
# `test_cuda` when B's sampler tests should run first). Runs B's sampler, log-probability,
# PDL-chain and batch-invariant GPU tests (the sampler against the host sampler), then
# ROUNDS (default 2) rounds of `gpu_sampler_bench` alternating A and B, then W2 (`pagellm
# bench --workload grpo`, whose rows race over the whole vocabulary) of A and of B. (The
# decode benchmarks are greedy, and a random-weight model's flat logits would send top-k
# rows to the bisection anyway: the peaked rows of gpu_sampler_bench stand for a trained
# model's.) Each command's output goes to LOGDIR; the summary lines to stdout. The shared
# libraries the binaries need must be on LD_LIBRARY_PATH (as scripts/gpu_suite.sh sets it).
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 DIR_A DIR_B LOGDIR [ROUNDS]" >&2
  exit 2
fi
A=$1 B=$2 LOG=$3 ROUNDS=${4:-2}
# shellcheck source=scripts/ab_common.sh
source "$(dirname "$0")/ab_common.sh"
ab_require_bins "$A $B" pagellm gpu_sampler_bench
mkdir -p "$LOG"
status=0
ab_gpu_tests "$B" "$LOG" "B: sampler, log-probability, PDL-chain and batch-invariant tests" \
  'GpuSampler*:*Sampl*:CudaLogprobs.*:PdlChainTest.*:*BatchInvariant*' || status=1
for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    dir=$A
    [ "$side" = B ] && dir=$B
    out="$LOG/sampler_${side}_r${round}.log"
    timeout 300 "$dir/gpu_sampler_bench" > "$out" 2>&1 || status=1
    echo "== $side, round $round: gpu_sampler_bench (µs a launch; one read of the logits)"
    grep -E "^(flat|peaked) " "$out" | awk '$(NF-4) == 1 || $(NF-4) == 32 || $(NF-4) == 512 {
      printf "  %-6s %s %4s rows %8s us %7s\n", $1, substr($0, 9, 16), $(NF-4), $(NF-3), $NF }'
  done
done
for side in A B; do
  dir=$A
  [ "$side" = B ] && dir=$B
  timeout 400 "$dir/pagellm" bench --workload grpo > "$LOG/w2_$side.log" 2>&1 || status=1
  echo "== $side: W2"
  grep -E "^  (rollout|limit) |decode 257" "$LOG/w2_$side.log"
done
exit $status
