#!/usr/bin/env bash
# Session e, run 2: the add-norm fusion (o_proj/down + residual add + next RMSNorm, the
# row scale applied by the next product): its tests, W1 with and without it, batch 1, trace.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
echo "== tests $(date +%T)"
timeout 200 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='NormFusion*:QkNormRope*:SkinnyGemm*:CudaOpTest.*' > $L/test_fusion.log 2>&1; echo "rc=$?"
grep -E "FAILED|Failure|error|PASSED|SKIPPED" $L/test_fusion.log | head -30
echo "== W1 $(date +%T)"
timeout 60 $B/bin/pagellm bench > $L/bench_w1.log 2>&1; grep -E "decode|error" $L/bench_w1.log | head -8
echo "== W1 norm fusion off $(date +%T)"
PAGELLM_DISABLE_NORM_FUSION=1 timeout 60 $B/bin/pagellm bench > $L/bench_w1_nofusion.log 2>&1; grep -E "decode |error" $L/bench_w1_nofusion.log | head -3
echo "== batch 1 $(date +%T)"
timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 > $L/bench_b1.log 2>&1; grep -E "decode|error" $L/bench_b1.log | head -4
echo "== trace $(date +%T)"
timeout 90 $B/bin/pagellm bench --trace-steps 8 --trace-out $L/trace_w1.csv > $L/trace_w1.log 2>&1; grep -v building $L/trace_w1.log | grep -A 14 "kernel trace\|repeating" | head -40
echo "== e2e 0.6b $(date +%T)"
dir=/tmp/hf-qwen3-0.6b
python3 python/model/save_pretrained_reference.py --preset qwen3-0.6b --out $dir --seed 0 --dtype bf16 > $L/save.log 2>&1
timeout 150 python3 python/e2e/compare_hf.py --model $dir --pagellm $B/bin/pagellm > $L/e2e_qwen3-0.6b.log 2>&1; echo "e2e rc=$?"; tail -5 $L/e2e_qwen3-0.6b.log
echo "== end $(date +%T)"
gzip -f $L/trace_w1.csv
cd $L && tar czf $OUT/run2.tar.gz .
