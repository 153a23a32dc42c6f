#!/usr/bin/env bash
# Session d, run 3: qkv product fused with q/k-norm + RoPE + KV store; sampler cluster.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
echo "== tests $(date +%T)"
timeout 300 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='QkNormRope*:SkinnyGemm*:GpuSampler*:CudaOpTest*:CudaBackend*:PagedAttention*:EngineAttentionBackend*:PdlChain*:PdlGraph*:MatmulTest*:Elementwise*' > $L/test_run3.log 2>&1; echo "rc=$?"; grep -E "FAILED|Failure|error" $L/test_run3.log | head -20; tail -4 $L/test_run3.log
for round in 1 2; do
for cfg in "X=1" "PAGELLM_DISABLE_QKV_FUSION=1"; do
  echo "== W1 $cfg (round $round) $(date +%T)" | tee -a $L/bench_w1_fusion.log
  env $cfg timeout 60 $B/bin/pagellm bench >> $L/bench_w1_fusion.log 2>&1
  grep -E "^  decode |achieved" $L/bench_w1_fusion.log | tail -2
done
done
echo "== trace $(date +%T)"
timeout 90 $B/bin/pagellm bench --trace-steps 8 --trace-out $L/trace_w1.csv > $L/trace_w1.log 2>&1; grep -v building $L/trace_w1.log | sed -n '/kernel trace/,/host runtime/p' | head -30
echo "== e2e $(date +%T)"
dir=/tmp/hf-qwen3-0.6b
python3 python/model/save_pretrained_reference.py --preset qwen3-0.6b --out $dir --seed 0 --dtype bf16 > $L/save_0.6b.log 2>&1
timeout 200 python3 python/e2e/compare_hf.py --model $dir --pagellm $B/bin/pagellm > $L/e2e_qwen3-0.6b.log 2>&1; echo "e2e rc=$?"; tail -8 $L/e2e_qwen3-0.6b.log
echo "== end $(date +%T)"
gzip -f $L/trace_w1.csv
cp -r $L $OUT/
