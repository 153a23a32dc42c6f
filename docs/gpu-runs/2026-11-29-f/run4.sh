#!/usr/bin/env bash
# Session f, run 4: decode splits of at least 128 keys of the real length (kMinKeysPerSplit
# on the device). The attention and engine suites, then scripts/gpu_suite.sh's bench step
# (W1 and the batch sweep 1, 8, 64, 128, 256) on the committed engine with packed weights.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
timeout 200 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='PagedAttention*:EngineAttentionBackend*:PackedWeights*:CudnnAttention*' > $L/test_attention.log 2>&1; echo "tests rc=$?"; tail -3 $L/test_attention.log
scripts/gpu_suite.sh gpu-bundle $L/suite bench 2>&1 | grep -E "decode  |===" 
echo "== end $(date +%T)"
cd $L && tar czf $OUT/run4.tar.gz .
