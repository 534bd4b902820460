#!/usr/bin/env bash
# Rebuilds the docs' board (docs/board: board.csv, apart.csv, board.html, index.md) from every
# run directory under results/: each folder that holds both a leaderboard.csv and a config.toml.
# A folder with a leaderboard.csv but no config.toml is named on stderr rather than skipped
# silently. Verifications come from the board's own ledger, docs/board/verifications.json
# (`leakbench board --verify RUN_DIR --ledger docs/board/verifications.json` adds one), and the
# committed runs' datasets from ../shared/data beside the repository (--data-root).
#
#   bash docs/board/build.sh            (from anywhere; it works from the repository's root)
#
# LEAKBENCH (default: leakbench) is the command to run; BOARD_RESULTS (default: results) and
# BOARD_OUT (default: docs/board) change where it reads and writes, e.g. to try it on a copy;
# BOARD_DATA_ROOT (default: ../shared/data) where the runs' data files are.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

read -r -a leakbench <<<"${LEAKBENCH:-leakbench}"
results=${BOARD_RESULTS:-results}
out=${BOARD_OUT:-docs/board}
ledger_file=docs/board/verifications.json

run_dirs=()
missing=()
while IFS= read -r -d '' board_file; do
  dir=$(dirname -- "$board_file")
  if [[ -f "$dir/config.toml" ]]; then
    run_dirs+=("$dir")
  else
    missing+=("$dir")
  fi
done < <(find "$results" -name leaderboard.csv -type f -print0 | LC_ALL=C sort -z)

for dir in ${missing[@]+"${missing[@]}"}; do
  printf 'build.sh: %s has a leaderboard.csv but no config.toml; not on the board\n' "$dir" >&2
done
if ((${#run_dirs[@]} == 0)); then
  echo "build.sh: no run directory under $results (leaderboard.csv with config.toml)" >&2
  exit 2
fi

data_root=${BOARD_DATA_ROOT:-../shared/data}
if [[ ! -d "$data_root" ]]; then
  echo "build.sh: no $data_root (the committed runs' datasets); set BOARD_DATA_ROOT" >&2
  exit 2
fi

echo "build.sh: ${#run_dirs[@]} run directories -> $out" >&2
LEAKBENCH_BOARD_COMMAND="bash docs/board/build.sh" \
  "${leakbench[@]}" board "${run_dirs[@]}" --ledger "$ledger_file" --data-root "$data_root" \
  --out "$out"
