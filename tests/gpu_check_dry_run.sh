#!/usr/bin/env bash
# scripts/gpu_check.sh exercised here, with no device (issue 32): the lease's check must report
# itself without a GPU and never hang or pass vacuously.
#   1. no nvidia-smi: exit 2 within a minute, summary.json naming the reason, every step not run;
#   2. a stub nvidia-smi that fails: the same, naming its message;
#   3. --dry-run with a stub nvidia-smi that answers: exit 3, every step of every phase listed
#      not run with its command, the preflight's findings, the tarball of the logs;
#   4. the same with the preflight's search pointed at a cuDNN wheel's layout (versioned library
#      only) and at nothing for NCCL: cuDNN found by its versioned name, NCCL named missing;
#   5. --plan: the worst case of build + run, plus a rerun of run, fits the 900 s lease.
# Needs python3 (json) and tar; prints "skipped: ..." (exit 77) without them.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 > /dev/null && command -v tar > /dev/null || { echo "skipped: needs python3 and tar"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }
export GPU_CHECK_BUILD_DIR=$work/build

# check_summary FILE EXIT REASON_PATTERN STATUS_ALL: summary.json's exit, reason and every step's status
check_summary() {
  python3 - "$@" << 'EOF' || exit 1
import json, re, sys
path, code, pattern, status = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
d = json.load(open(path))
assert d["exit"] == code, f"exit {d['exit']}, expected {code}"
assert re.search(pattern, d["reason"]), f"reason {d['reason']!r} does not match {pattern!r}"
assert d["steps"], "no steps listed"
for s in d["steps"]:
    assert s["status"] == status, f"{s['name']}: {s['status']}, expected {status}"
    assert s["reason"], f"{s['name']}: no reason given"
    assert s["command"], f"{s['name']}: no command"
EOF
}

# 1. No nvidia-smi at all (PATH without it): exit 2, fast.
mkdir -p "$work/bin" "$work/empty"
for tool in bash cat tar gzip dirname head tail grep timeout mkdir rm tr cut tee sed basename python3; do
  ln -sf "$(command -v $tool)" "$work/empty/$tool"
done
start=$SECONDS
rc=0
env PATH="$work/empty" OUT="$work/out1" bash scripts/gpu_check.sh > "$work/log1" 2>&1 || rc=$?
[ $rc = 2 ] || { cat "$work/log1"; fail "without nvidia-smi: exit $rc, expected 2"; }
((SECONDS - start < 60)) || fail "without nvidia-smi it took $((SECONDS - start)) s"
check_summary "$work/out1/summary.json" 2 'nvidia-smi not found' not_run
[ -f "$work/out1/logs.tar.gz" ] || fail "without nvidia-smi: no logs.tar.gz"

# 2. An nvidia-smi that fails, as on a machine whose driver does not answer.
printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver." >&2\nexit 9\n' \
  > "$work/bin/nvidia-smi"
chmod +x "$work/bin/nvidia-smi"
rc=0
env PATH="$work/bin:$PATH" OUT="$work/out2" bash scripts/gpu_check.sh --phase all > "$work/log2" 2>&1 || rc=$?
[ $rc = 2 ] || { cat "$work/log2"; fail "failing nvidia-smi: exit $rc, expected 2"; }
check_summary "$work/out2/summary.json" 2 'could not communicate with the NVIDIA driver' not_run

# 3. A dry run behind a stub that answers: every phase's steps listed, none run.
printf '#!/bin/sh\necho "NVIDIA H200 (stub), 143771 MiB, 580.00"\n' > "$work/bin/nvidia-smi"
rc=0
env PATH="$work/bin:$PATH" OUT="$work/out3" bash scripts/gpu_check.sh --phase all --dry-run > "$work/log3" 2>&1 || rc=$?
[ $rc = 3 ] || { cat "$work/log3"; fail "dry run: exit $rc, expected 3"; }
check_summary "$work/out3/summary.json" 3 '^dry run' not_run
python3 - "$work/out3/summary.json" << 'EOF' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
phases = {s["phase"] for s in d["steps"]}
assert phases == {"build", "run", "extra", "gpt"}, phases
assert d["gpu"].startswith("NVIDIA H200 (stub)"), d["gpu"]
assert all(s["reason"].startswith("dry run") for s in d["steps"])
assert {s["role"] for s in d["steps"]} == {"gate", "info"}
assert d["observations"] == [], d["observations"]  # no test ran: nothing observed
EOF
tar -tzf "$work/out3/logs.tar.gz" | grep -q preflight.log || fail "dry run: the tarball has no preflight.log"
(($(ls "$work/out3" | wc -l) <= 8)) || fail "dry run: more than 8 files in OUT"

# 4. The preflight on a wheel's layout: nvidia/cudnn/{include/cudnn.h, lib/libcudnn.so.9}.
mkdir -p "$work/wheel/nvidia/cudnn/include" "$work/wheel/nvidia/cudnn/lib"
echo '#define CUDNN_MAJOR 9' > "$work/wheel/nvidia/cudnn/include/cudnn.h"
: > "$work/wheel/nvidia/cudnn/lib/libcudnn.so.9"
rc=0
env PATH="$work/bin:$PATH" OUT="$work/out4" GPU_CHECK_SEARCH="$work/wheel/nvidia/cudnn:$work/empty" \
  bash scripts/gpu_check.sh --phase build,run --dry-run > "$work/log4" 2>&1 || rc=$?
[ $rc = 3 ] || { cat "$work/log4"; fail "preflight dry run: exit $rc, expected 3"; }
grep -q 'preflight: nccl NOT FOUND' "$work/log4" || { cat "$work/log4"; fail "the missing NCCL is not named"; }
python3 - "$work/out4/summary.json" "$work/wheel" << 'EOF' || exit 1
import json, sys
d, wheel = json.load(open(sys.argv[1])), sys.argv[2]
assert d["preflight"]["cudnn"]["library"] == wheel + "/nvidia/cudnn/lib/libcudnn.so.9", d["preflight"]
assert not d["preflight"]["nccl"]["found"], d["preflight"]
assert "missing: nccl" in d["reason"], d["reason"]
configure = next(s for s in d["steps"] if s["name"] == "configure")
assert "-DKILN_CUDNN_LIBRARY=" + wheel + "/nvidia/cudnn/lib/libcudnn.so.9" in configure["command"], configure
assert "-DKILN_CUDNN_INCLUDE_DIR=" + wheel + "/nvidia/cudnn/include" in configure["command"], configure
assert "KILN_NCCL" not in configure["command"], configure
EOF

# 5. The plan's arithmetic fits the lease with a rerun of the run phase.
plan=$(bash scripts/gpu_check.sh --plan)
echo "$plan"
worst=$(echo "$plan" | grep -oE 'with a rerun of run: [0-9]+' | grep -oE '[0-9]+$')
[ -n "$worst" ] && ((worst <= 900)) || fail "build + run + a rerun of run is ${worst:-?} s, over the 900 s lease"
echo "gpu_check dry run: all checks passed"
