#!/bin/sh
# expect_error.sh REGEX PROGRAM ARG...
# Runs PROGRAM ARG... and passes when it exits with status 1 and prints exactly one line
# (stdout and stderr together) that matches the extended regular expression REGEX.
# An ARG "@empty" is passed as an empty argument; "@b:TEXT" as printf '%b' TEXT (for bytes
# such as invalid UTF-8, which ctest's command lines cannot carry).
regex=$1
shift
program=$1
shift
n=$#
i=0
while [ $i -lt $n ]; do
  arg=$1
  shift
  case $arg in
    @empty) arg="" ;;
    @b:*) arg=$(printf '%b' "${arg#@b:}") ;;
  esac
  set -- "$@" "$arg"
  i=$((i + 1))
done
out=$("$program" "$@" 2>&1)
status=$?
lines=$(printf '%s\n' "$out" | wc -l)
if [ $status -ne 1 ]; then
  echo "expected exit status 1, got $status; output:"; printf '%s\n' "$out"; exit 1
fi
if [ "$lines" -ne 1 ]; then
  echo "expected one line of output, got $lines:"; printf '%s\n' "$out"; exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$regex"; then
  echo "output does not match /$regex/:"; printf '%s\n' "$out"; exit 1
fi
echo "ok: $out"
