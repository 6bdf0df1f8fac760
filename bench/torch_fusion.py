#!/usr/bin/env python3
"""PyTorch side of bench/fusion's transcendental chain: y = sigmoid(tanh(exp(x))) over --n float32
values, x[i] = sin(0.001·i) as in bench/fusion, on --threads threads (torch.set_num_threads, and
threadpoolctl's limits when it imports).

  eager     torch.sigmoid(torch.tanh(torch.exp(x)), out=y): three kernels, two temporaries that
            eager PyTorch allocates (and the allocator returns) on every call.
  compiled  torch.compile(dynamic=False) of y.copy_(sigmoid(tanh(exp(x)))): inductor fuses the
            chain and the copy into one loop that writes y in place. Both write a preallocated y,
            as kiln's assignment does; a compiled function returning a new tensor would also time
            the page faults of a fresh 4·n-byte buffer each call.
Compilation and one warm-up of each are outside the timing; then --reps interleaved reps of each
(so a slow moment of the machine hits both alike) and the medians. One JSON line:
{"bench": "fusion_transcendental_torch", "backend": "torch_cpu", "threads", "n", "reps",
 "torch_eager_s", "torch_compiled_s" (null when compile failed), "max_abs_diff", "torch"}, preceded by
{"bench": "fusion_transcendental_torch", "variant": "compiled", "skipped": "<why>"} when torch.compile
fails (e.g. no C++ compiler); without torch only {"bench": ..., "skipped": "<why>"}. Always exits 0.
"""
import argparse
import json
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=1 << 24)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--reps", type=int, default=11)
args = ap.parse_args()
base = {"bench": "fusion_transcendental_torch", "backend": "torch_cpu"}
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile workers beside the timing


def say(**kw):
    print(json.dumps({**base, **kw}), flush=True)


try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
    say(skipped=f"torch not importable ({type(e).__name__}: {e}) with {sys.executable}")
    raise SystemExit(0)

torch.set_num_threads(args.threads)
try:
    from threadpoolctl import threadpool_limits
    _limits = threadpool_limits(limits=args.threads)  # kept alive: it holds the limits
except Exception:  # noqa: BLE001 - torch.set_num_threads covers torch's own kernels
    pass


def chain(x):
    return torch.sigmoid(torch.tanh(torch.exp(x)))


try:
    x = (torch.arange(args.n, dtype=torch.float64) * 0.001).sin().float()
    y_eager, y_comp = torch.empty_like(x), torch.empty_like(x)

    def eager():
        torch.sigmoid(torch.tanh(torch.exp(x)), out=y_eager)

    eager()
    runs = {"eager": (eager, [])}
    try:
        if not hasattr(torch, "compile"):
            raise RuntimeError("this torch has no torch.compile")

        @torch.compile(dynamic=False)
        def fused(x, y):
            y.copy_(chain(x))

        fused(x, y_comp)  # compiles
        fused(x, y_comp)
        runs["compiled"] = (lambda: fused(x, y_comp), [])
    except Exception as e:  # noqa: BLE001 - eager still runs
        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        say(variant="compiled", skipped=f"{type(e).__name__}: {msg} (torch {torch.__version__})")
    for _ in range(args.reps):
        for f, times in runs.values():
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
    med = {k: statistics.median(t) for k, (_, t) in runs.items()}
    diff = float((y_eager - y_comp).abs().max()) if "compiled" in med else None
    say(threads=args.threads, n=args.n, reps=args.reps, torch_eager_s=round(med["eager"], 6),
        torch_compiled_s=round(med["compiled"], 6) if "compiled" in med else None, max_abs_diff=diff,
        torch=torch.__version__)
except Exception as e:  # noqa: BLE001 - never crash the benchmark that runs us
    say(skipped=f"{type(e).__name__}: {str(e).strip()[:300]} (torch {torch.__version__})")
