#!/usr/bin/env bash
# check-lossless on the bundled model for every drafter and back end kind, on the built-in and the
# held-out prompt sets. Writes one report per run to OUT (default /tmp/check-lossless) and a summary.
#   bash benchmarks/check_lossless_all.sh [OUT]
set -u
OUT=${1:-/tmp/check-lossless}
DG=${DG:-.venv/bin/draftgate}
mkdir -p "$OUT"
SETS=("builtin:" "heldout:--prompts benchmarks/prompts/heldout.jsonl --per-category 1")
run() {  # name, args...
  local name=$1; shift
  local t0=$SECONDS
  $DG check-lossless "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  local rc=$?
  printf '%-34s rc=%s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$(grep -E '^  (greedy|seeded|distribution)' "$OUT/$name.txt" | tr -s ' ' | tr '\n' ';')" | tee -a "$OUT/summary.txt"
}
: > "$OUT/summary.txt"
for s in "${SETS[@]}"; do
  set_name=${s%%:*}; set_args=${s#*:}
  for d in none ngram suffix auto eagle; do
    run "embedded-$d-$set_name" --drafter "$d" $set_args
  done
  run "embedded-ngram-k8-$set_name" --drafter ngram --k 8 $set_args
done
# A sampled model draft: the target's own weights as the draft (q == p in fp32: every rejection-path
# branch still runs), embedded.
run "embedded-model-builtin" --drafter model --draft-model smollm2-135m --k 4
# Split deployment: a gRPC target worker and HTTP draft workers (n-gram; a bf16 model draft, q != p).
$DG serve-target --port 50071 --log-level warning 2> "$OUT/target.err" & TPID=$!
$DG serve-draft --drafter ngram --port 8171 --log-level warning 2> "$OUT/draft-ngram.err" & NPID=$!
$DG serve-draft --drafter model --model smollm2-135m --dtype bfloat16 --port 8172 --log-level warning 2> "$OUT/draft-model.err" & MPID=$!
for url in http://127.0.0.1:8171/health http://127.0.0.1:8172/health; do
  for _ in $(seq 120); do curl -sf "$url" > /dev/null && break; sleep 1; done
done
sleep 5  # the target worker loads its model too
run "grpc-http-ngram-builtin" --target grpc://127.0.0.1:50071 --drafter http://127.0.0.1:8171 --draft-timeout-ms 2000
run "grpc-http-ngram-heldout" --target grpc://127.0.0.1:50071 --drafter http://127.0.0.1:8171 --draft-timeout-ms 2000 \
  --prompts benchmarks/prompts/heldout.jsonl --per-category 1
run "grpc-http-model-bf16-builtin" --target grpc://127.0.0.1:50071 --drafter http://127.0.0.1:8172 --draft-timeout-ms 5000
kill $TPID $NPID $MPID 2> /dev/null; wait 2> /dev/null
echo "reports in $OUT"
