#!/usr/bin/env bash
# Session f, run 1: packed weights in the engine. Their tests first, then W1 and batch 1
# with PAGELLM_PACKED_WEIGHTS=0 and auto alternating (same binary), a W1 trace with
# packing, then the full op suite.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
echo "== packed tests $(date +%T)"
timeout 60 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='PackedWeights*' > $L/test_packed.log 2>&1; echo "rc=$?"; tail -5 $L/test_packed.log
for i in 1 2; do
  for v in 0 auto; do
    echo "== W1 / b1 [PAGELLM_PACKED_WEIGHTS=$v] #$i $(date +%T)"
    PAGELLM_PACKED_WEIGHTS=$v timeout 60 $B/bin/pagellm bench >> $L/ab_w1_$v.log 2>&1; grep -E "decode  |weights  " $L/ab_w1_$v.log | tail -2
    PAGELLM_PACKED_WEIGHTS=$v timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 >> $L/ab_b1_$v.log 2>&1; grep -E "decode  " $L/ab_b1_$v.log | tail -1
  done
done
echo "== trace $(date +%T)"
timeout 90 $B/bin/pagellm bench --trace-steps 8 --trace-out $L/trace_w1.csv > $L/trace_w1.log 2>&1; grep -v building $L/trace_w1.log | grep -A 9 "repeating" | head -10
echo "== tests $(date +%T)"
timeout 280 $B/bin/test_cuda --gtest_brief=1 > $L/test_cuda.log 2>&1; echo "test_cuda rc=$?"; tail -5 $L/test_cuda.log
echo "== end $(date +%T)"
gzip -f $L/trace_w1.csv
cd $L && tar czf $OUT/run1.tar.gz .
