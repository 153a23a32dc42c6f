#!/usr/bin/env bash
# Session f, run 2: L2 prefetch of the next product's weights from the latency-bound
# kernels before it (attention -> o_proj, input norm -> qkv). W1 and batch 1 with
# PAGELLM_L2_PREFETCH=none / attention / norm / all alternating, twice; engine tests.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
timeout 120 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='PackedWeights*:EngineAttentionBackend*:CudaOpTest*' > $L/test_subset.log 2>&1; echo "tests rc=$?"; tail -3 $L/test_subset.log
for i in 1 2; do
  for v in none attention norm all; do
    echo "== [PAGELLM_L2_PREFETCH=$v] #$i $(date +%T)"
    PAGELLM_L2_PREFETCH=$v timeout 60 $B/bin/pagellm bench >> $L/ab_w1_$v.log 2>&1; grep -E "decode  " $L/ab_w1_$v.log | tail -1
    PAGELLM_L2_PREFETCH=$v timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 >> $L/ab_b1_$v.log 2>&1; grep -E "decode  " $L/ab_b1_$v.log | tail -1
  done
done
echo "== end $(date +%T)"
cd $L && tar czf $OUT/run2.tar.gz .
