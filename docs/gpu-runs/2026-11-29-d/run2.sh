#!/usr/bin/env bash
# Session d, run 2: cluster sampler; experiments: TMA attention 2 stages, skinny 4 stages at 32 tokens.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
echo "== tests $(date +%T)"
timeout 200 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='GpuSampler*:CudaOpTest*:CudaBackend*:PagedAttention.Decode*' > $L/test_run2.log 2>&1; echo "rc=$?"; tail -6 $L/test_run2.log
PAGELLM_DECODE_TMA_STAGES=2 timeout 200 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='PagedAttention.Decode*' > $L/test_run2_tma2.log 2>&1; echo "tma2 rc=$?"; tail -3 $L/test_run2_tma2.log
PAGELLM_SKINNY_STAGES=4 timeout 200 $B/bin/test_cuda --gtest_brief=1 --gtest_filter='SkinnyGemm*' > $L/test_run2_sk4.log 2>&1; echo "sk4 rc=$?"; tail -3 $L/test_run2_sk4.log
for round in 1 2; do
for cfg in "X=1" "PAGELLM_DECODE_TMA_STAGES=2" "PAGELLM_SKINNY_STAGES=4" "PAGELLM_DECODE_TMA_STAGES=2 PAGELLM_SKINNY_STAGES=4"; do
  echo "== W1 $cfg (round $round) $(date +%T)" | tee -a $L/bench_w1_exp.log
  env $cfg timeout 60 $B/bin/pagellm bench >> $L/bench_w1_exp.log 2>&1
  grep -E "^  decode |achieved" $L/bench_w1_exp.log | tail -2
done
done
echo "== trace $(date +%T)"
timeout 90 $B/bin/pagellm bench --trace-steps 8 --trace-out $L/trace_w1.csv > $L/trace_w1.log 2>&1; grep -v building $L/trace_w1.log | sed -n '/repeating/,$p' | head -12; grep -E "sample_rows|lm_head|<32, true" $L/trace_w1.log
echo "== end $(date +%T)"
gzip -f $L/trace_w1.csv
cp -r $L $OUT/
