#!/usr/bin/env bash
# Session g, run 1: HEAD (6e23d15) plus skinny_producer_warp.patch (session f). The full
# test_cuda with the default kernel (the committed code's path), the suites that run the
# skinny kernel with the producer-warp variant on, W1 and batch 1 with
# PAGELLM_SKINNY_PRODUCER=0 / 1 alternating, twice, then matmul_bench --quick for both.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
timeout 240 $B/bin/test_cuda --gtest_brief=1 > $L/test_cuda.log 2>&1; echo "full tests rc=$?"; tail -4 $L/test_cuda.log
PAGELLM_SKINNY_PRODUCER=1 timeout 150 $B/bin/test_cuda --gtest_brief=1 \
  --gtest_filter='SkinnyGemm*:QkNormRope*:PdlChain*:PdlGraph*:PackedWeights*:EngineAttentionBackend*:MatmulTest*' \
  > $L/test_producer.log 2>&1; echo "producer tests rc=$?"; tail -4 $L/test_producer.log
for i in 1 2; do
  for v in 0 1; do
    PAGELLM_SKINNY_PRODUCER=$v timeout 60 $B/bin/pagellm bench >> $L/ab_w1_$v.log 2>&1
    echo "W1 producer $v: $(grep -E 'decode  ' $L/ab_w1_$v.log | tail -1)"
    PAGELLM_SKINNY_PRODUCER=$v timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 >> $L/ab_b1_$v.log 2>&1
    echo "b1 producer $v: $(grep -E 'decode  ' $L/ab_b1_$v.log | tail -1)"
  done
done
for v in 0 1; do
  PAGELLM_SKINNY_PRODUCER=$v timeout 90 $B/bin/matmul_bench --quick > $L/matmul_bench_producer_$v.log 2>&1
  echo "matmul_bench producer $v:"; tail -12 $L/matmul_bench_producer_$v.log
done
cd $L && tar czf $OUT/run1.tar.gz .
