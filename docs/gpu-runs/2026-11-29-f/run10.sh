#!/usr/bin/env bash
# Session f, run 10: the norms trigger their dependent before their wait (committed). The
# suites that run the norm kernels in chains and graphs, then W1 and batch 1 once.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
timeout 90 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='Pdl*:ElementwiseTest*:EngineAttentionBackend*:PackedWeights*:CudaOpTest*' > $L/test_subset.log 2>&1; echo "tests rc=$?"; tail -3 $L/test_subset.log
timeout 40 $B/bin/pagellm bench > $L/bench_w1.log 2>&1; grep -E "decode  " $L/bench_w1.log
timeout 30 $B/bin/pagellm bench --batch 1 --output-len 128 > $L/bench_b1.log 2>&1; grep -E "decode  " $L/bench_b1.log
cd $L && tar czf $OUT/run10.tar.gz .
