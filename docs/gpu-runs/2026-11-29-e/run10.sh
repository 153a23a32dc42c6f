#!/usr/bin/env bash
# Session e, run 10: the packed-weights build's other skinny users (engine, fused qkv, PDL
# chains, LtMatmul, backend ops) and W1, which runs with row-major weights as before.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
timeout 40 $B/bin/pagellm bench > $L/bench_w1.log 2>&1; grep -E "decode  " $L/bench_w1.log
timeout 90 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='EngineAttentionBackend*:QkNormRope*:PdlChain*:PdlGraph*:MatmulTest*:CudaOpTest*' > $L/test_subset.log 2>&1; echo "rc=$?"
grep -E "FAILED|Failure|PASSED|SKIPPED|tests from" $L/test_subset.log | tail -6
cd $L && tar czf $OUT/run10.tar.gz .
