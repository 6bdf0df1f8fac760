#!/usr/bin/env python3
"""A compiler launcher that records what each compile cost: one JSON line per translation unit.

    compile_probe.py LOG COMPILER ARGS...

runs `COMPILER ARGS...` and appends to LOG
    {"source": ..., "object": ..., "compiler": "c++", "seconds": 12.3, "cpu_seconds": 12.1,
     "peak_mib": 812, "exit": 0}
where peak_mib is the largest resident set of the compiler's processes (the kernel's ru_maxrss of
the reaped child, which covers the cc1plus / cicc it waited for). CMake puts it in front of every
compile of kiln's own targets (CMAKE_<LANG>_COMPILER_LAUNCHER, see CMakeLists.txt), so any build
of the project leaves build/compile_times.jsonl behind, and bench/compile_time reads it. A
launcher after it on the command line (ccache) is simply the COMPILER here.
"""
import json
import os
import sys
import time


def main() -> int:
    if len(sys.argv) < 3:
        sys.stderr.write("usage: compile_probe.py LOG COMPILER ARGS...\n")
        return 2
    log, cmd = sys.argv[1], sys.argv[2:]
    start = time.monotonic()
    try:
        pid = os.posix_spawnp(cmd[0], cmd, os.environ)
    except OSError as e:
        sys.stderr.write(f"compile_probe.py: cannot run {cmd[0]}: {e}\n")
        return 127
    _, status, usage = os.wait4(pid, 0)
    seconds = time.monotonic() - start
    code = os.waitstatus_to_exitcode(status)

    def arg_after(flag: str) -> str:
        return cmd[cmd.index(flag) + 1] if flag in cmd[:-1] else ""

    compilers = [os.path.basename(a) for a in cmd if not a.startswith("-")][:2]
    record = {
        "source": arg_after("-c"),
        "object": arg_after("-o"),
        "compiler": compilers[-1] if compilers and compilers[0] == "ccache" else (compilers or ["?"])[0],
        "seconds": round(seconds, 3),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),
        "peak_mib": round(usage.ru_maxrss / 1024.0, 1),
        "exit": code,
    }
    line = json.dumps(record) + "\n"
    # One write in append mode: parallel compiles do not interleave their lines.
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return code


if __name__ == "__main__":
    sys.exit(main())
