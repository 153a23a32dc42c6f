#!/usr/bin/env bash
# Session e, run 3: deep skinny pipeline (grids of at most one CTA per SM take all of the
# SM's shared memory) + the add-norm epilogue's residual prefetched in the prologue.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
echo "== tests $(date +%T)"
timeout 200 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='NormFusion*:QkNormRope*:SkinnyGemm*' > $L/test_fusion.log 2>&1; echo "rc=$?"
grep -E "FAILED|Failure|error|PASSED|SKIPPED" $L/test_fusion.log | head -30
for v in "" "PAGELLM_SKINNY_DEEP=0" "PAGELLM_DISABLE_NORM_FUSION=1"; do
  echo "== W1 [$v] $(date +%T)"
  env $v timeout 60 $B/bin/pagellm bench > $L/bench_w1_${v%%=*}.log 2>&1; grep -E "decode |error" $L/bench_w1_${v%%=*}.log | head -3
  echo "== batch 1 [$v] $(date +%T)"
  env $v timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 > $L/bench_b1_${v%%=*}.log 2>&1; grep -E "decode |error" $L/bench_b1_${v%%=*}.log | head -3
done
echo "== trace $(date +%T)"
timeout 90 $B/bin/pagellm bench --trace-steps 8 --trace-out $L/trace_w1.csv > $L/trace_w1.log 2>&1; grep -v building $L/trace_w1.log | grep -A 8 "repeating" | head -12
echo "== matmul bench $(date +%T)"
timeout 150 $B/bin/matmul_bench --quick --out $L/matmul_bench.csv > $L/matmul_bench.log 2>&1; grep -E "4B |o_proj|down|qkv" $L/matmul_bench.log | head -40
echo "== end $(date +%T)"
gzip -f $L/trace_w1.csv
cd $L && tar czf $OUT/run3.tar.gz .
