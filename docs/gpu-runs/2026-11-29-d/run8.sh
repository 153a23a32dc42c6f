#!/usr/bin/env bash
# Session d, run 8: the cuDNN graph-replay test with its one-ulp tolerance, repeated.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
timeout 100 $B/bin/test_cuda --gtest_brief=1 --gtest_repeat=10 --gtest_filter='CudnnAttention.DecodeGraph*:PagedAttention.DecodeGraph*:PagedAttention.DecodeForced*' > $L/test_cudnn_ulp.log 2>&1; echo "rc=$?"
grep -E "Failure|differ|FAILED" $L/test_cudnn_ulp.log | sort | uniq -c | head; grep -c "PASSED" $L/test_cudnn_ulp.log
tar -C /tmp -czf $OUT/gl8.tar.gz gl
