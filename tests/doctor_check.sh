#!/usr/bin/env bash
# kiln-doctor's contract: it prints the host and a verdict and exits 0; with --expect-gpu it
# exits 0 exactly when the verdict is a GPU, and otherwise 1 with the reason on stderr.
set -uo pipefail
doctor=$1
out=$("$doctor") || { echo "kiln-doctor exited $? without --expect-gpu:"; echo "$out"; exit 1; }
echo "$out"
for want in "^host" "cpu " "build targets" "hardware threads" "ok    CPU GEMM" "^verdict: training will run on the "; do
  grep -q "$want" <<<"$out" || { echo "FAIL: the report lacks \"$want\""; exit 1; }
done
err=$("$doctor" --expect-gpu 2>&1 >/dev/null); rc=$?
if grep -q "^verdict: training will run on the GPU" <<<"$out"; then
  [ "$rc" -eq 0 ] || { echo "FAIL: a GPU verdict, but --expect-gpu exited $rc: $err"; exit 1; }
else
  [ "$rc" -eq 1 ] && grep -q "no GPU is usable: training will run on the CPU: " <<<"$err" ||
    { echo "FAIL: a CPU verdict, but --expect-gpu exited $rc saying: $err"; exit 1; }
  echo "--expect-gpu: exit 1, \"$err\""
fi
"$doctor" --no-such-option 2>/dev/null; [ $? -eq 2 ] || { echo "FAIL: an unknown option must exit 2"; exit 1; }
echo "doctor_check: ok"
