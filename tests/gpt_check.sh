#!/usr/bin/env bash
# train_gpt end to end, briefly (issue 30): 30 iterations of nanoGPT's baby GPT on the shipped text
# must bring the validation loss well below its start (ln 65 = 4.17), print a sample and close with
# the figures; bad inputs are refused with a sentence naming them.
#   tests/gpt_check.sh TRAIN_GPT DATA_DIR WORK_DIR
set -uo pipefail
bin=$1 data=$2 work=$3
fail=0
rm -rf "$work" && mkdir -p "$work/short" "$work/wide"
out=$("$bin" --data-dir "$data" --iters 30 --warmup 5 --eval-every 15 --eval-iters 2 --sample 40 --threads 2 2>&1)
rc=$?
echo "$out" | grep -E "^iter|final val loss|kernels per training step|^mode"
loss=$(sed -n 's/^final val loss \([0-9.]*\);.*/\1/p' <<<"$out")
if [ "$rc" -ne 0 ] || [ -z "$loss" ] || ! awk -v l="$loss" 'BEGIN { exit !(l < 3.6) }'; then
  echo "FAIL train_gpt: exit $rc, final val loss '${loss}' (wanted < 3.6)"
  fail=1
fi
grep -q "^sample:" <<<"$out" || { echo "FAIL train_gpt: no sample printed"; fail=1; }
grep -q "micro-batches replayed" <<<"$out" || { echo "FAIL train_gpt: reduce_overhead replayed nothing"; fail=1; }

# "arguments|text the message must hold"
printf 'to be or not' | gzip > "$work/short/tinyshakespeare.txt.gz"
awk 'BEGIN { for (c = 33; c < 123; ++c) printf "%c%c", c, 10 }' | gzip > "$work/wide/tinyshakespeare.txt.gz"
cases=(
  "--data-dir $work/short --iters 10 --warmup 1|(train, first 90%) has 10 tokens, too few for one window of T + 1 = 65"
  "--data-dir $work/wide --iters 10 --warmup 1|has 91 distinct characters; this program's model is built for at most 65"
  "--data-dir $work/none --iters 10 --warmup 1|$work/none/tinyshakespeare.txt.gz"
  "--data-dir $data --mode fast|--mode must be reduce_overhead or default, got \"fast\""
  "--data-dir $data --iters 10|--warmup (100) must not exceed --iters (10)"
)
for c in "${cases[@]}"; do
  args=${c%%|*} want=${c#*|}
  # shellcheck disable=SC2086
  err=$("$bin" $args 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne 1 ] || ! grep -qF -- "$want" <<<"$err"; then
    echo "FAIL train_gpt $args: exit $rc, stderr: $err (wanted: $want)"
    fail=1
  fi
done
[ "$fail" -eq 0 ] && echo "gpt_check: trained to val loss $loss in 30 iterations; ${#cases[@]} bad inputs refused, each named"
exit "$fail"
