#!/bin/sh
# Feeds a valid line, a line with a byte that is not UTF-8, and another valid line to
# `pagellm tokenize`, `detokenize` and `chat-template --jsonl`; each must print three lines,
# the middle one {"error": "line 2: ..."}, and exit with status 1.
# Usage: bad_input_lines.sh PAGELLM MODEL_DIR
pagellm=$1
model=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
failures=0

check() {  # NAME INPUT ARGS...
  name=$1
  input=$2
  shift 2
  printf "$input" | "$pagellm" "$@" --model "$model" > "$out" 2>/dev/null
  rc=$?
  lines=$(wc -l < "$out")
  first=$(sed -n 1p "$out")
  second=$(sed -n 2p "$out")
  third=$(sed -n 3p "$out")
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 3 ] ||
     ! printf '%s' "$second" | grep -q '^{"error":"line 2: input is not valid UTF-8' ||
     printf '%s' "$first" | grep -q '"error"' || printf '%s' "$third" | grep -q '"error"'; then
    echo "FAIL $name: exit status $rc (want 1), $lines lines (want 3, the second an error):"
    cat "$out"
    failures=$((failures + 1))
  else
    echo "ok $name: $second"
  fi
}

check tokenize '"Hello"\n"bad \377 byte"\n{"text": "world"}\n' tokenize
check detokenize '[1, 2]\n[1, 2] \377\n{"ids": [3]}\n' detokenize
check chat-template \
  '[{"role": "user", "content": "hi"}]\n[{"role": "user", "content": "\377"}]\n[{"role": "user", "content": "bye"}]\n' \
  chat-template --jsonl
[ "$failures" -eq 0 ]
