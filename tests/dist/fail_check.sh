#!/usr/bin/env bash
# A rank that throws ends the whole MPI job with an error, and soon: runs tests/dist/fail_rank.cpp
# on 2 ranks under a 60 s timeout and requires a non-zero status that is not the timeout's, and
# the failing rank's error on stderr.
# usage: fail_check.sh "MPIRUN;ARGS;...;-np-flag" BINARY
set -uo pipefail
IFS=';' read -r -a launcher <<< "$1"
bin=$2
log=$(mktemp)
start=$(date +%s)
timeout 60 "${launcher[@]}" 2 "$bin" >"$log" 2>&1
status=$?
took=$(( $(date +%s) - start ))
cat "$log"
if [ "$status" -eq 0 ]; then echo "FAIL: the job ended with status 0"; exit 1; fi
if [ "$status" -eq 124 ]; then echo "FAIL: the job hung (killed by the 60 s timeout)"; exit 1; fi
if ! grep -q "fail_rank: error on rank 1 of 2 (mpi): train: batch 3 could not be read" "$log"; then
  echo "FAIL: the failing rank's error is not in the output"; exit 1
fi
rm -f "$log"
echo "ok: the job ended with status $status after ${took} s, naming the failing rank"
