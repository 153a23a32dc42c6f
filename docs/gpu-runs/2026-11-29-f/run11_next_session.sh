#!/usr/bin/env bash
# Prepared in session f, NOT RUN (the session's device time was spent): the producer-warp
# skinny kernel (skinny_producer_warp.patch, applied and built with scripts/build_gpu.sh
# first). The skinny, fused and engine suites with the variant on, then W1 and batch 1 with
# PAGELLM_SKINNY_PRODUCER=0 / 1 alternating, twice, and matmul_bench --quick with it on.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
PAGELLM_SKINNY_PRODUCER=1 timeout 150 $B/bin/test_cuda --gtest_brief=1 \
  --gtest_filter='SkinnyGemm*:QkNormRope*:PdlChain*:PdlGraph*:PackedWeights*:EngineAttentionBackend*:MatmulTest*' \
  > $L/test_producer.log 2>&1; echo "tests rc=$?"; tail -3 $L/test_producer.log
for i in 1 2; do
  for v in 0 1; do
    PAGELLM_SKINNY_PRODUCER=$v timeout 60 $B/bin/pagellm bench >> $L/ab_w1_$v.log 2>&1
    echo "W1 producer $v: $(grep -E 'decode  ' $L/ab_w1_$v.log | tail -1)"
    PAGELLM_SKINNY_PRODUCER=$v timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 >> $L/ab_b1_$v.log 2>&1
    echo "b1 producer $v: $(grep -E 'decode  ' $L/ab_b1_$v.log | tail -1)"
  done
done
PAGELLM_SKINNY_PRODUCER=1 timeout 60 $B/bin/matmul_bench --quick > $L/matmul_bench_producer.log 2>&1; tail -4 $L/matmul_bench_producer.log
cd $L && tar czf $OUT/run11.tar.gz .
