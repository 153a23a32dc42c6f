#!/usr/bin/env bash
# Session e, run 1: baseline on ba6b163 (the clean-up commit): full test_cuda, W1, W1 trace.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
echo "== W1 $(date +%T)"
timeout 60 $B/bin/pagellm bench > $L/bench_w1.log 2>&1; grep -E "decode|error" $L/bench_w1.log | head -8
echo "== trace $(date +%T)"
timeout 90 $B/bin/pagellm bench --trace-steps 8 --trace-out $L/trace_w1.csv > $L/trace_w1.log 2>&1; grep -v building $L/trace_w1.log | tail -30
echo "== batch 1 $(date +%T)"
timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 > $L/bench_b1.log 2>&1; grep -E "decode|error" $L/bench_b1.log | head -4
echo "== tests $(date +%T)"
timeout 300 $B/bin/test_cuda --gtest_brief=1 > $L/test_cuda.log 2>&1; echo "test_cuda rc=$?"
tail -8 $L/test_cuda.log
echo "== end $(date +%T)"
gzip -f $L/trace_w1.csv
cd $L && tar czf $OUT/run1.tar.gz .
