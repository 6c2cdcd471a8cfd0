#!/usr/bin/env bash
# Runs a command and passes only when it exits 0 AND prints exactly COUNT lines matching REGEX
# (grep -E): ctest's PASS_REGULAR_EXPRESSION alone would pass a command that printed the line and
# then failed, or whose other ranks failed.
#   tests/support/expect_lines.sh COUNT REGEX -- COMMAND [ARGS...]
set -uo pipefail
count=$1 regex=$2
shift 2
[ "${1:-}" = -- ] && shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
got=$(printf '%s\n' "$out" | grep -cE -- "$regex")
if [ "$rc" -ne 0 ]; then
  echo "expect_lines: the command exited $rc" >&2
  exit 1
fi
if [ "$got" -ne "$count" ]; then
  echo "expect_lines: $got lines match '$regex', expected $count" >&2
  exit 1
fi
