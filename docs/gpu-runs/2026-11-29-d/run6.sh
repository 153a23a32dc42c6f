#!/usr/bin/env bash
# Session d, run 6: the final code after the duplicate clean-up (shared DecodeCta, one
# QkNormRopeArgs for both q/k-norm paths): the suites it touches, W1.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
timeout 240 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='QkNormRope*:PagedAttention*:SkinnyGemm*:CudaOpTest*:EngineAttentionBackend*:PdlChain*:PdlGraph*:CudaBackend*:GpuSampler*' > $L/test_final.log 2>&1; echo "rc=$?"; grep -E "FAILED|Failure" $L/test_final.log | head; tail -4 $L/test_final.log
for i in 1 2; do timeout 60 $B/bin/pagellm bench >> $L/bench_w1_after_cleanup.log 2>&1; done; grep -E "^  decode |achieved" $L/bench_w1_after_cleanup.log
tar -C /tmp -czf $OUT/gl6.tar.gz gl
