#!/usr/bin/env bash
# Resume equivalence (issue 11): `train_digits --epochs 10` in one go against `--epochs 4`, then
# `--epochs 10 --resume` from its checkpoint. Both print "state crc32c X" (the CRC-32C of every
# parameter and buffer) and their final accuracy; they must be equal, bit for bit.
#
#   scripts/resume_check.sh [--bin build/examples/train_digits] [--data-dir data] [--first 4] [--total 10]
#     [-- extra train_digits flags, e.g. --precision fp16_mixed --accumulate 2]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/examples/train_digits data=data first=4 total=10
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --data-dir) data=$2; shift 2 ;;
    --first) first=$2; shift 2 ;;
    --total) total=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--bin PATH] [--data-dir DIR] [--first N] [--total N] [-- flags]" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { "$bin" --data-dir "$data" "${extra[@]}" "$@"; }
run --epochs "$total" --checkpoint-dir "$work/whole" >"$work/whole.log"
run --epochs "$first" --checkpoint-dir "$work/split" >"$work/first.log"
run --epochs "$total" --checkpoint-dir "$work/split" --resume >"$work/second.log"
grep -q "^resumed from .*epoch $((first + 1)), batch 0" "$work/second.log" || {
  echo "resume_check: the second run did not resume at epoch $((first + 1)):" >&2
  cat "$work/second.log" >&2
  exit 1
}
a=$(grep -E "^state crc32c|^final test accuracy" "$work/whole.log" | sed 's/; total.*//')
b=$(grep -E "^state crc32c|^final test accuracy" "$work/second.log" | sed 's/; total.*//')
echo "uninterrupted $total epochs:     $(echo $a)"
echo "$first epochs + resume to $total: $(echo $b)"
if [ "$a" != "$b" ]; then
  echo "resume_check: FAILED: the resumed run ends elsewhere" >&2
  exit 1
fi
# The last epoch's line (loss and accuracy) is the same too.
diff <(grep "^epoch $(printf '%2d' "$total")/" "$work/whole.log" | sed 's/  [0-9.]* s$//') \
     <(grep "^epoch $(printf '%2d' "$total")/" "$work/second.log" | sed 's/  [0-9.]* s$//')
echo "resume_check: identical"
