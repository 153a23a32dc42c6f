#!/usr/bin/env bash
# The GPU suite: runs on a GPU machine from a build made by scripts/build_gpu.sh (no
# compiler or package needed there beyond the CUDA toolkit, python3 with torch and
# transformers). Usage: scripts/gpu_suite.sh BUNDLE_DIR LOG_DIR [steps...]
# BUNDLE_DIR holds bundle.tar.xz (bin/ and lib/) as scripts/build_gpu.sh leaves it.
# Steps (default: all but ablate and soak): tests e2e logprobs bench rl python lora serve broadcast trace prefill ablate attn gemm stream calib hf tp soak
# "python" installs the bundle's wheel (pagellm-*-cp312-*.whl) into /tmp/pagellm-site and
# runs scripts/grpo_loop.py: 20 GRPO steps with torch, weights pushed by update_weights,
# pagellm's score() checked against torch after each push.
# "serve" runs scripts/serve_bench.py: `pagellm serve` at several request rates (throughput,
# TTFT and ITL percentiles) and a colocated CUDA IPC weight update from torch, timed, with
# the log-probabilities checked after it (SERVE_PRESET, default qwen3-0.6b).
# "logprobs" compares sampled tokens' logprobs (bf16 and float32 heads, and score()) with
# transformers in float32 (LOGPROB_PRESETS, default qwen3-0.6b; add qwen3-4b when wanted).
# "soak" runs scripts/soak.sh for SOAK_MINUTES (default 10) against the bundle's `pagellm
# serve --backend cuda` on random weights of SOAK_PRESET (default qwen3-0.6b; the tiny
# preset's head_dim 32 has no CUDA attention kernel): 64 clients, malformed requests,
# disconnects; pages back, RSS flat (issue 21). Not in the default steps (it takes minutes).
# "lora" installs the bundle's wheels (gpu-bundle/wheels: peft, accelerate, psutil) and the
# pagellm wheel, then runs scripts/lora_peft_check.py: pagellm's LoRA (CLI --lora logits and
# a mixed-adapter LLM.generate batch) against transformers + PEFT in float32 on a random
# Qwen3-0.6B with two random r = 32 adapters (LORA_PRESET), and the W1 LoRA benchmarks: one
# r = 32 adapter and 8 adapters, each as a fraction of W1 without LoRA (--lora-compare;
# LORA_BENCH=0 leaves them out).
# "broadcast" runs scripts/weight_broadcast_bench.py on random Qwen3-4B (BROADCAST_PRESETS):
# the whole model broadcast from a torch trainer to `pagellm serve`, timed, log-probabilities
# checked; over NCCL (server on GPU 1, trainer on GPU 0) with two GPUs, else over "tcp".
# "tp" (two GPUs or more; skipped below): W1 and batch-1 decode at tensor_parallel_size 2
# beside 1 in the same call (issue 22's targets: >= 1.6x and >= 1.5x), and the NCCL
# broadcast of Qwen3-4B and Qwen3-8B (target: 8B <= 1 s).
# "trace" records 8 mid-decode W1 steps' kernels (CUPTI) and prints where the time goes.
# "prefill" runs `pagellm bench` at 16 x 2,048 and 4 x 8,192 prompt tokens beside
# bench/peers/hf_prefill.py (transformers, SDPA) and traces the 16 x 2,048 prefill.
# "ablate" re-runs W1 with one optimisation off at a time (ABLATIONS: VAR=VALUE items).
# "sampler" times the GPU sampler by row count, sampling parameters and logits shape
# (bench/gpu_sampler_bench.cu) against one read of the logits at the copy rate.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${1:-gpu-bundle}
LOG=${2:-gpu-logs}
shift 2 || true
# Where the bundle is unpacked (PAGELLM_GPU_DIR): a second suite started while one runs
# (a soak in the background) needs its own.
B=${PAGELLM_GPU_DIR:-/tmp/pagellm-gpu}
rm -rf "$B" && mkdir -p "$B" && xz -dc "$BUNDLE/bundle.tar.xz" | tar -C "$B" -xf - || exit 1
STEPS=${*:-tests e2e logprobs bench rl python lora serve broadcast trace prefill attn gemm stream sampler calib hf tp}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:/usr/local/cuda-13.0/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
# NCCL (tensor parallelism; test_cuda's Nccl* tests): pagellm dlopens libnccl.so.2, which is
# too large for the bundle; the machine's PyTorch has one in its nvidia-nccl-cu13 wheel
# (nvidia/nccl/lib). NVLink multicast (NVLS) stays off: it has taken shared hosts' GPUs out
# of service (pagellm sets the same default itself; this covers torch's runs here too).
if [ -z "${PAGELLM_NCCL_LIBRARY:-}" ]; then
  nccl_lib=$(python3 -c "
import glob, os, site
dirs = [os.path.join(p, 'nvidia', 'nccl', 'lib') for p in site.getsitepackages()]
try:
    import nvidia.nccl as m
    dirs = [os.path.join(p, 'lib') for p in m.__path__] + dirs
except ImportError:
    pass
hits = [f for d in dirs for f in sorted(glob.glob(os.path.join(d, 'libnccl.so*')))]
print(hits[0] if hits else '')" 2>/dev/null)
  [ -n "$nccl_lib" ] && export PAGELLM_NCCL_LIBRARY="$nccl_lib"
fi
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# The measured crossover tables of the attention dispatcher travel with the source tree.
export PAGELLM_ATTENTION_TABLES="${PAGELLM_ATTENTION_TABLES:-$PWD/data/attention}"
status=0
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$LOG/gpu.txt"
ldd "$B/bin/pagellm" | grep -E "not found|cublas|cudnn" | tee "$LOG/ldd.txt"
echo "NCCL: ${PAGELLM_NCCL_LIBRARY:-not found (the Nccl* tests will fail)}; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE" | tee -a "$LOG/ldd.txt"

if has tests; then
  step "op tests (test_cuda)"
  "$B/bin/test_cuda" --gtest_brief=1 2>&1 | tee "$LOG/test_cuda.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if has e2e; then
  for preset in ${E2E_PRESETS:-qwen3-0.6b qwen3-4b}; do
    step "end to end against transformers: $preset"
    dir=/tmp/hf-$preset
    [ -f "$dir/config.json" ] || python3 tests/oracles/model/save_pretrained_reference.py \
      --preset "$preset" --out "$dir" --seed 0 --dtype bf16 > "$LOG/save_$preset.log" 2>&1
    python3 tests/oracles/e2e/compare_hf.py --model "$dir" --pagellm "$B/bin/pagellm" 2>&1 | tee "$LOG/e2e_$preset.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi

if has logprobs; then
  for preset in ${LOGPROB_PRESETS:-qwen3-0.6b}; do
    step "log-probabilities against transformers: $preset"
    dir=/tmp/hf-$preset
    [ -f "$dir/config.json" ] || python3 tests/oracles/model/save_pretrained_reference.py \
      --preset "$preset" --out "$dir" --seed 0 --dtype bf16 > "$LOG/save_$preset.log" 2>&1
    python3 tests/oracles/logprobs/compare_logprobs.py --model "$dir" --pagellm "$B/bin/pagellm" 2>&1 | tee "$LOG/logprobs_$preset.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi

if has bench; then
  step "pagellm bench: W1 and the batch sweep"
  "$B/bin/pagellm" bench --json-out "$LOG/bench.jsonl" 2>&1 | tee "$LOG/bench_w1.log"
  for batch in ${BENCH_BATCHES:-1 8 64 128 256}; do
    "$B/bin/pagellm" bench --batch "$batch" --output-len 128 --json-out "$LOG/bench.jsonl" 2>&1 | tee -a "$LOG/bench_sweep.log"
  done
fi

if has rl; then
  step "RL rollouts: W1 batch-invariant, weight updates, sleep/wake, W2 (grpo)"
  "$B/bin/pagellm" bench --batch-invariant --json-out "$LOG/rl.jsonl" 2>&1 | tee "$LOG/bench_w1_invariant.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  for workload in weight-update sleep-wake grpo; do
    "$B/bin/pagellm" bench --workload "$workload" --json-out "$LOG/rl.jsonl" 2>&1 | tee "$LOG/bench_$workload.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi

if has python; then
  step "Python package: the wheel, then a GRPO loop with torch (scripts/grpo_loop.py)"
  rm -rf /tmp/pagellm-site
  python3 -m pip install -q --no-index --no-deps --target /tmp/pagellm-site "$BUNDLE"/pagellm-*.whl \
    2>&1 | tee "$LOG/python_install.log" | tail -5
  # Without the bundle's lib/ on the path: the wheel carries the runtimes it needs.
  (cd /tmp && PYTHONPATH=/tmp/pagellm-site LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda-13.0/lib64 \
    timeout 900 python3 "$OLDPWD/scripts/grpo_loop.py" \
    --workdir /tmp/pagellm-grpo) 2>&1 | tee "$LOG/grpo_loop.log" | tail -30
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if has lora; then
  step "LoRA: transformers + PEFT against pagellm (scripts/lora_peft_check.py)"
  rm -rf /tmp/peft-site /tmp/pagellm-site /tmp/pagellm-lora-check
  python3 -m pip install -q --no-index --no-deps --target /tmp/peft-site "$BUNDLE"/wheels/*.whl \
    2>&1 | tee "$LOG/lora_install.log" | tail -5
  python3 -m pip install -q --no-index --no-deps --target /tmp/pagellm-site "$BUNDLE"/pagellm-*.whl \
    2>&1 | tee -a "$LOG/lora_install.log" | tail -5
  preset=${LORA_PRESET:-qwen3-0.6b}
  dir=/tmp/hf-$preset  # the e2e step's folder when it ran (same seed and dtype)
  [ -f "$dir/config.json" ] || python3 tests/oracles/model/save_pretrained_reference.py \
    --preset "$preset" --out "$dir" --seed 0 --dtype bf16 > "$LOG/save_$preset.log" 2>&1
  # With the bundle's lib/ on the path, as the e2e step runs torch: the CLI needs it, and
  # the wheel's module finds its own runtimes first (DT_RPATH $ORIGIN).
  PYTHONPATH=/tmp/pagellm-site:/tmp/peft-site timeout 1200 python3 scripts/lora_peft_check.py \
    --model "$dir" --pagellm "$B/bin/pagellm" --backend cuda --device cuda \
    --workdir /tmp/pagellm-lora-check 2>&1 | tee "$LOG/lora_peft_$preset.log" | tail -30
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  step "LoRA: W1 with one r = 32 adapter, then with 8 (each against W1 without LoRA)"
  [ "${LORA_BENCH:-1}" = 0 ] && echo "skipped (LORA_BENCH=0)"
  for n in $([ "${LORA_BENCH:-1}" = 0 ] || echo 1 8); do
    "$B/bin/pagellm" bench --lora-rank 32 --lora-adapters "$n" --lora-compare \
      --json-out "$LOG/bench_lora.jsonl" 2>&1 | grep -v building | tee -a "$LOG/bench_lora.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi

if has trace; then
  step "W1 kernel trace: where a decode step's time goes"
  "$B/bin/pagellm" bench --trace-steps 8 --trace-out "$LOG/trace_w1.csv" 2>&1 | grep -v building | tee "$LOG/trace_w1.log"
fi

if has prefill; then
  step "prefill throughput (issue 20): pagellm beside transformers, and a traced prefill"
  for shape in "16 2048" "4 8192"; do
    set -- $shape
    "$B/bin/pagellm" bench --batch "$1" --prompt-len "$2" --output-len 2 --json-out "$LOG/prefill.jsonl" 2>&1 \
      | grep -v building | tee -a "$LOG/prefill.log"
    timeout 300 python3 bench/peers/hf_prefill.py --batch "$1" --prompt-len "$2" 2>&1 | tail -1 | tee -a "$LOG/prefill.log"
  done
  "$B/bin/pagellm" bench --batch 16 --prompt-len 2048 --output-len 2 --trace-prefill \
    --trace-out "$LOG/trace_prefill.csv" 2>&1 | grep -v building | tee "$LOG/trace_prefill.log"
fi

if has ablate; then
  step "W1 ablations: one switch at a time"
  for setting in ${ABLATIONS:-PAGELLM_DISABLE_PDL=1 PAGELLM_MATMUL=cublaslt}; do
    echo "--- $setting" | tee -a "$LOG/bench_ablate.log"
    env "$setting" "$B/bin/pagellm" bench --json-out "$LOG/bench_ablate.jsonl" 2>&1 | tee -a "$LOG/bench_ablate.log"
  done
fi

if has attn; then
  step "paged attention kernels"
  "$B/bin/attention_bench" ${ATTN_BENCH_ARGS:-} --out "$LOG/attention_bench.csv" 2>&1 | tee "$LOG/attention_bench.log" | tail -60
fi

if has gemm; then
  step "decode matrix products: cuBLASLt against the skinny kernel"
  "$B/bin/matmul_bench" ${GEMM_BENCH_ARGS:-} --out "$LOG/matmul_bench.csv" 2>&1 | tee "$LOG/matmul_bench.log" | tail -70
fi

if has stream; then
  step "the weight stream's own ceiling: a layer's products as chained and as persistent kernels"
  "$B/bin/layer_stream_bench" 2>&1 | tee "$LOG/layer_stream_bench.log"
fi

if has sampler; then
  step "the GPU sampler: rows, parameters and logits shapes"
  "$B/bin/gpu_sampler_bench" 2>&1 | tee "$LOG/gpu_sampler_bench.log"
fi

if has calib; then
  step "attention dispatcher: calibration and routes"
  mkdir -p "$LOG/tables"
  "$B/bin/pagellm" calibrate-attention ${CALIB_ARGS:---quick} --out "$LOG/tables/" 2>&1 | tee "$LOG/calibrate.log" | tail -40
  "$B/bin/attention_route_bench" routes ${CALIB_ARGS:---quick} --table "$LOG/tables/" 2>&1 | tee "$LOG/routes.log" | tail -60
fi

if has hf; then
  step "transformers on W1 (static cache, compiled)"
  timeout 400 python3 bench/peers/hf_w1.py 2>&1 | tail -3 | tee "$LOG/hf_w1.log"
fi
if has serve; then
  preset=${SERVE_PRESET:-qwen3-0.6b}
  step "pagellm serve: request rates and a CUDA IPC weight update ($preset)"
  dir=/tmp/hf-$preset
  [ -f "$dir/config.json" ] || python3 tests/oracles/model/save_pretrained_reference.py \
    --preset "$preset" --out "$dir" --seed 0 --dtype bf16 > "$LOG/save_$preset.log" 2>&1
  python3 scripts/serve_bench.py --pagellm "$B/bin/pagellm" --model "$dir" \
    --out "$LOG/serve.jsonl" 2>&1 | tee "$LOG/serve.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if has broadcast; then
  for preset in ${BROADCAST_PRESETS:-qwen3-4b}; do
    dir=/tmp/rand-$preset
    [ -f "$dir/config.json" ] || "$B/bin/pagellm" make-model --preset "$preset" --out "$dir" > /dev/null 2>&1
    if [ "$gpus" -ge 2 ]; then
      step "weight broadcast over NCCL from a torch trainer on GPU 0 to pagellm serve on GPU 1 ($preset)"
      args=(--transport nccl --server-gpu 1 --trainer-device cuda:0)
    else
      step "weight broadcast over tcp from a torch trainer to pagellm serve ($preset; one GPU)"
      args=(--transport tcp --trainer-device cpu)
    fi
    timeout 600 python3 scripts/weight_broadcast_bench.py --pagellm "$B/bin/pagellm" --model "$dir" \
      "${args[@]}" --out "$LOG/broadcast.jsonl" 2>&1 | tee -a "$LOG/broadcast.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi
if has tp; then
  if [ "$gpus" -lt 2 ]; then
    step "tensor parallelism: skipped ($gpus GPU; needs 2)"
  else
    step "tensor parallelism: W1 and batch 1 at TP 2 beside TP 1; NCCL broadcast of 4B and 8B"
    for tp in 1 2; do
      "$B/bin/pagellm" bench --tensor-parallel-size $tp --json-out "$LOG/tp$tp.jsonl" 2>&1 | tee -a "$LOG/tp.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      "$B/bin/pagellm" bench --tensor-parallel-size $tp --batch 1 --output-len 128 \
        --json-out "$LOG/tp$tp.jsonl" 2>&1 | tee -a "$LOG/tp.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
    python3 - "$LOG/tp1.jsonl" "$LOG/tp2.jsonl" <<'PY' | tee -a "$LOG/tp.log"
import json, sys
def tok(path, batch):
    rows = [json.loads(l) for l in open(path)] if __import__("os").path.exists(path) else []
    hits = [r["decode_tok_s"] for r in rows if r.get("batch") == batch]
    return hits[-1] if hits else None
for batch, target in ((32, 1.6), (1, 1.5)):
    one, two = tok(sys.argv[1], batch), tok(sys.argv[2], batch)
    if one and two:
        print(f"TP 2 / TP 1 at batch {batch}: {two:.0f} / {one:.0f} tok/s = {two / one:.2f}x (target {target}x)")
    else:
        print(f"TP 2 / TP 1 at batch {batch}: a run gave no figure")
PY
    for preset in qwen3-4b qwen3-8b; do
      dir=/tmp/rand-$preset
      [ -f "$dir/config.json" ] || "$B/bin/pagellm" make-model --preset "$preset" --out "$dir" > /dev/null 2>&1
      timeout 600 python3 scripts/weight_broadcast_bench.py --pagellm "$B/bin/pagellm" --model "$dir" \
        --transport nccl --server-gpu 1 --trainer-device cuda:0 --out "$LOG/broadcast.jsonl" 2>&1 | tee -a "$LOG/tp.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
  fi
fi
if has soak; then
  preset=${SOAK_PRESET:-qwen3-0.6b}
  step "soak: pagellm serve --backend cuda for ${SOAK_MINUTES:-10} min ($preset, random weights)"
  dir=/tmp/soak-$preset
  [ -f "$dir/config.json" ] || "$B/bin/pagellm" make-model --preset "$preset" --out "$dir" \
    > "$LOG/soak_make_model.log" 2>&1
  PAGELLM_BIN="$B/bin/pagellm" scripts/soak.sh --minutes "${SOAK_MINUTES:-10}" --model "$dir" \
    --samples "$LOG/soak_samples.csv" -- --backend cuda 2>&1 | tee "$LOG/soak.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
echo
echo "gpu suite: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
