#!/usr/bin/env bash
# Regenerates results/learned: each config of configs/ into a folder of its name. Run from the
# repository root, as every committed run is, so each run's recorded paths are the root's.
# Usage: bash results/learned/run.sh [NAME ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(scramble defenses none-digits none-mnist none-cifar10
  none-cifar10-pairs7500 convnet-cifar10 convnet-cifar10-pairs7500
  convnet-cifar10-pairs7500-sketch16384 user-cnn-b1 user-cnn-b4 ig-start-digits small-defenses)
for name in "${names[@]}"; do
  /usr/bin/time -v python -m leakbench.cli run "results/learned/configs/$name.toml" \
    --out "results/learned/$name" --quiet 2> "results/learned/$name.time.txt"
done
