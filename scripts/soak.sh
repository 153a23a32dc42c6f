#!/usr/bin/env bash
# Soak test of `pagellm serve` (issue 21): serves for --minutes (default 10) under 64
# concurrent streaming clients with random prompts and parameters, malformed requests and
# random disconnects; fails on any unintended error, a crash, pages not all free at the
# end, or resident memory growing more than 5 % after warm-up. Prints the figures.
#   scripts/soak.sh [--minutes 10] [--clients 64] [--model DIR] [-- serve options...]
# PAGELLM_BIN picks the binary (default build/pagellm); on the GPU machine pass
# --model DIR -- --backend cuda.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export PAGELLM_BIN="${PAGELLM_BIN:-$root/build/pagellm}"
exec python3 "$root/scripts/soak_driver.py" "$@"
