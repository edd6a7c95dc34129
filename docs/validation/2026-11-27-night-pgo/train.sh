#!/bin/bash
# usage: train.sh BIN REPO ; runs the training workloads (traces not used by the benchmarks)

B=$1; R=$2; T=${TRAIN_DIR:-train}; mkdir -p $T
[ -f $T/a.csv ] || { $B generate random --seed 11 --events 1000000 -o $T/a.csv; $B generate random --seed 12 --streams 2 --events 500000 -o $T/b.csv; }
for p in caching immediate buddy arena "caching:expandable_segments=True"; do
  $B replay $T/a.csv --policy "$p" > /dev/null
  $B replay $T/b.csv --policy "$p" > /dev/null
done
for f in $R/tests/data/recorded/*.json; do $B replay "$f" > /dev/null 2>&1 || true; done
$B fidelity $R/tests/data/recorded/*.json > /dev/null 2>&1 || true
$B bench $T/b.csv --runs 1 > /dev/null
$B compare $T/b.csv $R/examples/training_loop.yaml --policies caching,immediate,buddy,arena > /dev/null
$B check $T/a.csv > /dev/null
