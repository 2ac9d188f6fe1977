#!/bin/sh
# Prints the results `make bench` gathered (one tab-separated row per result
# line: the benchmark, the line) as one Markdown table, the form DESIGN.md's
# "Measurements" reproduces.
set -eu
table=${1:-target/bench-table.tsv}
if [ ! -s "$table" ]; then
  echo "bench-table: no results in $table" >&2
  exit 1
fi
echo
echo "| benchmark | result |"
echo "|---|---|"
# A `|` inside a result would end its cell: escaped.
awk -F '\t' '{ r = $2; gsub(/\|/, "\\|", r); printf "| %s | %s |\n", $1, r }' "$table"
