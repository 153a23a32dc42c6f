#!/usr/bin/env bash
# Session e, run 4: the add-norm fusion (residual prefetched, row scales loaded by all warps,
# no deep pipeline): W1 and batch 1 with the fusion on and off, alternating, three times
# each; the full op suite; Qwen3-4B end to end against transformers.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
for i in 1 2 3; do
  for v in PAGELLM_DISABLE_NORM_FUSION=0 PAGELLM_DISABLE_NORM_FUSION=1; do
    echo "== W1 [$v] #$i $(date +%T)"
    env $v timeout 60 $B/bin/pagellm bench >> $L/ab_w1_${v##*=}.log 2>&1; grep -E "decode  " $L/ab_w1_${v##*=}.log | tail -1
    env $v timeout 60 $B/bin/pagellm bench --batch 1 --output-len 128 >> $L/ab_b1_${v##*=}.log 2>&1; grep -E "decode  " $L/ab_b1_${v##*=}.log | tail -1
  done
done
echo "== trace $(date +%T)"
timeout 90 $B/bin/pagellm bench --trace-steps 8 --trace-out $L/trace_w1.csv > $L/trace_w1.log 2>&1; grep -v building $L/trace_w1.log | grep -A 8 "repeating" | head -9
echo "== tests $(date +%T)"
timeout 300 $B/bin/test_cuda --gtest_brief=1 > $L/test_cuda.log 2>&1; echo "test_cuda rc=$?"; tail -4 $L/test_cuda.log
echo "== e2e 4b $(date +%T)"
dir=/tmp/hf-qwen3-4b
python3 python/model/save_pretrained_reference.py --preset qwen3-4b --out $dir --seed 0 --dtype bf16 > $L/save.log 2>&1
timeout 200 python3 python/e2e/compare_hf.py --model $dir --pagellm $B/bin/pagellm > $L/e2e_qwen3-4b.log 2>&1; echo "e2e rc=$?"; tail -3 $L/e2e_qwen3-4b.log
echo "== end $(date +%T)"
gzip -f $L/trace_w1.csv
cd $L && tar czf $OUT/run4.tar.gz .
