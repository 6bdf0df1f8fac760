#!/usr/bin/env bash
# finetune_resnet end to end on a tiny folder (2 classes x 10 digits at 64x64, PNG and JPEG):
# bf16_mixed, --accumulate 2, layer4 + fc trained for an epoch; the run must close with its
# closing line and the frozen layers bit-identical (the program checks and exits 1 otherwise).
# Then its refusals: a --train-from naming no layer, an empty class folder, a corrupt JPEG, a
# micro-batch over --memory-budget — each exit 1 with a sentence naming what is wrong.
#   tests/finetune_resnet_check.sh BIN DIGITS_DIR WORK_DIR
set -uo pipefail
bin=$1 digits=$2 work=$3
rm -rf "$work"
fail=0
expect() {  # expect "what" WANT CMD...: exit 1 and stderr holding WANT
  local what=$1 want=$2
  shift 2
  local err rc
  err=$("$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne 1 ] || ! grep -qF -- "$want" <<<"$err"; then
    echo "FAIL $what: exit $rc, stderr: $err (wanted: $want)"
    fail=1
  fi
}
"$bin" --make-demo-data "$work/data" --digits-dir "$digits" --demo-classes 2 --demo-images 10 || exit 1
out=$("$bin" --data-dir "$work/data" --epochs 1 --batch 8 --accumulate 2 --precision bf16_mixed --workers 2 \
      --threads 2 2>&1); rc=$?
echo "$out"
if [ "$rc" -ne 0 ] || ! grep -q "^final val accuracy " <<<"$out" || ! grep -q "bit-identical after training" <<<"$out"; then
  echo "FAIL finetune_resnet run: exit $rc"
  fail=1
fi
expect "--train-from" "--train-from layer9: no such layer; the layers are conv1, bn1, layer1, layer2, layer3, layer4, fc" \
  "$bin" --data-dir "$work/data" --train-from layer9
expect "--memory-budget" "over the budget" "$bin" --data-dir "$work/data" --batch 64 --memory-budget 300MiB
mkdir -p "$work/data/train/9"
expect "empty class folder" "train/9" "$bin" --data-dir "$work/data" --epochs 1
rmdir "$work/data/train/9"
first=$(ls "$work/data/train/1/"*.jpg | head -1)
head -c 300 "$first" > "$first.tmp" && mv "$first.tmp" "$first"
expect "corrupt JPEG" "$(basename "$first")" "$bin" --data-dir "$work/data" --epochs 1
[ "$fail" -eq 0 ] && echo "finetune_resnet_check: trained, frozen layers bit-identical, 4 bad inputs refused naming them"
exit "$fail"
