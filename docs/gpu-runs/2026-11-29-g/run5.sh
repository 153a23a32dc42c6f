#!/usr/bin/env bash
# Session g, run 5: the code to be committed (norms trigger early only from 32 rows). The
# full test_cuda, then W1 and batches 1, 4, 8, 16 and 64 once each.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
timeout 300 $B/bin/test_cuda --gtest_brief=1 > $L/test_cuda.log 2>&1; echo "tests rc=$?"; tail -3 $L/test_cuda.log
timeout 60 $B/bin/pagellm bench > $L/bench_w1.log 2>&1; echo "W1: $(grep -E 'decode  ' $L/bench_w1.log)"
for b in 1 4 8 16 64; do
  timeout 60 $B/bin/pagellm bench --batch $b --output-len 128 > $L/bench_b$b.log 2>&1
  echo "b$b: $(grep -E 'decode  ' $L/bench_b$b.log)"
done
cd $L && tar czf $OUT/run5.tar.gz .
