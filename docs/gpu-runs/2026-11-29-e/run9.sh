#!/usr/bin/env bash
# Session e, run 9: the skinny kernel streaming weights packed as its shared-memory stages
# (pack_skinny_weights): bit-identity tests, then matmul_bench's row-major/packed section.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
timeout 100 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='SkinnyGemm*' > $L/test_skinny.log 2>&1; echo "rc=$?"
grep -E "FAILED|Failure|PASSED|differ" $L/test_skinny.log | head
timeout 60 $B/bin/matmul_bench --quick > $L/matmul_bench.log 2>&1; echo "rc=$?"
sed -n '/row-major against packed/,/step:/p' $L/matmul_bench.log
cd $L && tar czf $OUT/run9.tar.gz .
