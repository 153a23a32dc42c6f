#!/usr/bin/env bash
# Session d, run 5: cuDNN graph-replay test repeated, dispatcher calibration against the TMA
# decode kernel, W1 + trace, end to end on Qwen3-4B.
set -uo pipefail
B=/tmp/pagellm-gpu; L=/tmp/gl; rm -rf $B $L; mkdir -p $B $L/tables
xz -dc gpu-bundle/bundle.tar.xz | tar -C $B -xf -
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda-13.0/lib64
export PAGELLM_ATTENTION_TABLES=$PWD/data/attention
echo "== cudnn graph tests x15 $(date +%T)"
timeout 120 $B/bin/test_cuda --gtest_brief=1 --gtest_repeat=15 --gtest_filter='CudnnAttention.DecodeGraph*' > $L/test_cudnn_repeat.log 2>&1; echo "rc=$?"; grep -E "differs|FAILED" $L/test_cudnn_repeat.log | sort | uniq -c | head; grep -c "PASSED" $L/test_cudnn_repeat.log
echo "== calibrate $(date +%T)"
timeout 120 $B/bin/attention_route_bench calibrate --quick --out $L/tables/ > $L/calibrate.log 2>&1; echo "rc=$?"; grep -E "decode|wrote" $L/calibrate.log | tail -30
timeout 120 $B/bin/attention_route_bench routes --quick --table $L/tables/ > $L/routes.log 2>&1; echo "rc=$?"; tail -25 $L/routes.log
echo "== W1 $(date +%T)"
for i in 1 2; do timeout 60 $B/bin/pagellm bench >> $L/bench_w1.log 2>&1; done; grep -E "^  decode |achieved" $L/bench_w1.log
timeout 90 $B/bin/pagellm bench --trace-steps 8 --trace-out $L/trace_w1.csv > $L/trace_w1.log 2>&1; sed -n '/repeating/,/unit total/p' $L/trace_w1.log
gzip -f $L/trace_w1.csv
echo "== e2e 4B $(date +%T)"
dir=/tmp/hf-qwen3-4b
timeout 150 python3 python/model/save_pretrained_reference.py --preset qwen3-4b --out $dir --seed 0 --dtype bf16 > $L/save_4b.log 2>&1
timeout 200 python3 python/e2e/compare_hf.py --model $dir --pagellm $B/bin/pagellm > $L/e2e_qwen3-4b.log 2>&1; echo "e2e rc=$?"; tail -8 $L/e2e_qwen3-4b.log
echo "== end $(date +%T)"
tar -C /tmp -czf $OUT/gl5.tar.gz gl
