#!/usr/bin/env bash
# Session e, run 5: each skinny product prefetches the next product's first weight boxes
# into L2 once its own weights are streamed. Prefetch tests, then W1 and batch 1 with the
# prefetch on and off (PAGELLM_DISABLE_L2_PREFETCH), alternating, three times each; trace.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
timeout 100 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='SkinnyGemm*' > $L/test_skinny.log 2>&1; echo "skinny tests rc=$?"
grep -E "FAILED|Failure|PASSED" $L/test_skinny.log | head
for i in 1 2 3; do
  for v in 0 1; do
    echo "== #$i PAGELLM_DISABLE_L2_PREFETCH=$v $(date +%T)"
    PAGELLM_DISABLE_L2_PREFETCH=$v timeout 60 $B/bin/pagellm bench >> $L/ab_w1_$v.log 2>&1; grep -E "decode  " $L/ab_w1_$v.log | tail -1
    PAGELLM_DISABLE_L2_PREFETCH=$v timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 >> $L/ab_b1_$v.log 2>&1; grep -E "decode  " $L/ab_b1_$v.log | tail -1
  done
done
echo "== trace $(date +%T)"
timeout 90 $B/bin/pagellm bench --trace-steps 8 --trace-out $L/trace_w1.csv > $L/trace_w1.log 2>&1; grep -v building $L/trace_w1.log | grep -A 10 "repeating" | head -11
echo "== end $(date +%T)"
gzip -f $L/trace_w1.csv
cd $L && tar czf $OUT/run5.tar.gz .
