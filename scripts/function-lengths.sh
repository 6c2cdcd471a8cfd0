#!/usr/bin/env bash
# Prints the longest functions in lib/, apps/ and tests/ (lines of code and cyclomatic complexity, as
# lizard counts them) and fails when one other than the option table (config::build_table, data) is
# over 100 lines of code. Usage: scripts/function-lengths.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
if ! "$PY" -c 'import lizard' 2>/dev/null; then
  "$PY" -m pip install -q -r scripts/requirements-tools.txt
fi
# CSV columns: NLOC, CCN, tokens, parameters, length, location, file, function, ...
table=$("$PY" -m lizard lib apps tests --csv 2>/dev/null | awk -F, '{gsub(/"/, "", $8); print $1 "\t" $2 "\t" $8}' | sort -n -r)
echo "[lint] the 10 longest functions in lib/, apps/ and tests/ (NLOC, CCN, function):"
awk -F'\t' 'NR <= 10 {printf "  %5d %4d  %s\n", $1, $2, $3}' <<<"$table"
over=$(awk -F'\t' '$1 > 100 && $3 != "fsdp::config::build_table" {print "  " $3 " (" $1 " lines)"}' <<<"$table")
if [ -n "$over" ]; then
  printf '[lint] error: functions over 100 lines of code; split them into named steps:\n%s\n' "$over" >&2
  exit 1
fi
