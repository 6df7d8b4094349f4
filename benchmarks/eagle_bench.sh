#!/usr/bin/env bash
# The draft head against plain decoding, and auto with it against auto without it, side by side
# (arms interleaved window by window in one warm process, medians over runs; greedy). Every run starts
# from the same drafter memory (bench forgets the suffix trie between runs), so medians over runs hold
# for suffix and auto too.
#   bash benchmarks/eagle_bench.sh [OUT]   (about 18 minutes on a 2-core CPU with four arms)
set -euo pipefail
OUT=${1:-bench-eagle}
DG=${DG:-.venv/bin/draftgate}
ARMS=${ARMS:-plain,eagle,auto,auto:head=none}  # auto: with the shipped head (default) and without it
# Held-out prompts: open chat, writing, QA, translation (open-ended) and the grounded categories.
$DG bench --prompts benchmarks/prompts/heldout.jsonl --arms $ARMS --runs 3 --max-new-tokens 128 \
    --no-plots --out "$OUT/heldout"
# The open-chat evaluation prompts (held out from the head's training data).
$DG bench --prompts src/draftgate/data/chat_eval.jsonl --arms $ARMS --runs 2 --max-new-tokens 128 \
    --no-plots --out "$OUT/chat_eval"
# Ten held-out translation requests (the held-out file has two; none of these sentences is in training data).
$DG bench --prompts benchmarks/prompts/heldout_translation.jsonl --arms $ARMS --runs 3 --max-new-tokens 128 \
    --no-plots --out "$OUT/translation"
# The built-in prompts (what `make demo` runs).
$DG bench --arms $ARMS --runs 2 --no-plots --out "$OUT/builtin"
