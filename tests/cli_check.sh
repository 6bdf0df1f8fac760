#!/usr/bin/env bash
# Every example answers --help (exit 0, a usage line) and refuses each bad command line below with
# exit 1 and a sentence on stderr that names the option (and the value, where there is one).
#   tests/cli_check.sh BIN...
set -uo pipefail
fail=0
# "arguments|text the message must hold"
cases=(
  "--epochs abc|option --epochs: \"abc\" is not an integer"
  "--epochs 2.5|option --epochs: \"2.5\" is not an integer"
  "--epochs 0|option --epochs: \"0\" must be positive"
  "--epochs 99999999999|option --epochs: \"99999999999\" is out of range"
  "--epochs|option --epochs needs a value"
  "--batch -4|option --batch: \"-4\" must be positive"
  "--lr fast|option --lr: \"fast\" is not a number"
  "--lr inf|option --lr: \"inf\" is not a finite number"
  "--lr nan|option --lr: \"nan\" is not a finite number"
  "--lr -1e-3|option --lr: \"-1e-3\" must be positive"
  "--threads 0|option --threads: \"0\" must be positive"
  "--no-such-option 3|unknown option --no-such-option"
  "stray|unexpected argument \"stray\""
)
for bin in "$@"; do
  name=$(basename "$bin")
  help=$("$bin" --help 2>&1); rc=$?
  if [ "$rc" -ne 0 ] || ! grep -q "^usage: $name" <<<"$help"; then
    echo "FAIL $name --help: exit $rc, output: $help"
    fail=1
  fi
  for c in "${cases[@]}"; do
    args=${c%%|*} want=${c#*|}
    # finetune_digits and finetune_resnet take --epochs 0 (evaluate only).
    case "$name" in finetune_digits|finetune_resnet) [ "$args" = "--epochs 0" ] && continue ;; esac
    # train_gpt counts iterations, not epochs: the same cases on --iters.
    # (--iters is 64-bit: 99999999999 iterations is a valid, if long, run.)
    if [ "$name" = train_gpt ]; then
      [ "$args" = "--epochs 99999999999" ] && continue
      args=${args//--epochs/--iters} want=${want//--epochs/--iters}
    fi
    # shellcheck disable=SC2086
    err=$("$bin" $args 2>&1 >/dev/null); rc=$?
    if [ "$rc" -ne 1 ] || ! grep -qF -- "$want" <<<"$err"; then
      echo "FAIL $name $args: exit $rc, stderr: $err (wanted: $want)"
      fail=1
    fi
  done
done
[ "$fail" -eq 0 ] && echo "cli_check: $# programs answer --help and refuse ${#cases[@]} bad command lines, naming the option"
exit "$fail"
