#!/usr/bin/env bash
# On the GPU machine: pipelined decode against step-by-step decode in one build, in one
# call so that both see the same GPU, clocks and host (docs/design.md, "Pipelined decode").
#
#   scripts/ab_pipelined.sh DIR LOGDIR ["STEPS ..."] [ROUNDS]
#
# DIR: a folder holding `pagellm` (and `test_cuda`, whose pipelined-decode and sampler
# tests then run first). Runs ROUNDS (default 2) rounds of W2 (`pagellm bench --workload
# grpo`), W1 (`pagellm bench`) and batch-1 decode (`pagellm bench --batch 1 --output-len
# 256`), each with `--pipelined-decode-steps 1` and then each of STEPS (default "8 64").
# Each command's output goes to LOGDIR; the summary lines to stdout. The shared libraries
# the binaries need must be on LD_LIBRARY_PATH (as scripts/gpu_suite.sh sets it).
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 DIR LOGDIR [\"STEPS ...\"] [ROUNDS]" >&2
  exit 2
fi
DIR=$1 LOG=$2 STEPS=${3:-"8 64"} ROUNDS=${4:-2}
# shellcheck source=scripts/ab_common.sh
source "$(dirname "$0")/ab_common.sh"
ab_require_bins "$DIR" pagellm
mkdir -p "$LOG"
status=0
ab_gpu_tests "$DIR" "$LOG" "pipelined decode and sampler GPU tests" \
  '*Pipelined*:GpuSampler*:BatchInvariantEngine*:*Graph*' || status=1
for round in $(seq 1 "$ROUNDS"); do
  # shellcheck disable=SC2086
  for n in 1 $STEPS; do
    out="$LOG/w2_p${n}_r${round}.log"
    timeout 400 "$DIR/pagellm" bench --workload grpo --pipelined-decode-steps "$n" \
      > "$out" 2>&1 || status=1
    echo "W2, pipelined $n, round $round:"
    grep -E "^  (rollout|limit|host gap) " "$out"
    for args in "" "--batch 1 --output-len 256"; do
      name=w1
      [ -n "$args" ] && name=b1
      out="$LOG/${name}_p${n}_r${round}.log"
      # shellcheck disable=SC2086
      timeout 300 "$DIR/pagellm" bench $args --pipelined-decode-steps "$n" > "$out" 2>&1 \
        || status=1
      echo "$name, pipelined $n, round $round:"
      grep -E "^  (decode|host gap) |fraction|of the limit" "$out" | head -4
    done
  done
done
exit $status
