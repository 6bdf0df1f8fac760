#!/usr/bin/env python3
"""PyTorch eager training step for MLP 400-256-128-10 (ReLU): forward, cross-entropy,
backward, AdamW step, zero_grad(set_to_none=True). Random inputs; warmup, then the median
over many steps. One JSON line per batch size. Run: /usr/bin/python3 bench/torch_train_step.py

--device cpu (default): each step timed on its own; the median step.
--device cuda: --reps blocks of --steps steps, each timed by CUDA events around the block with
no synchronisation inside it (torch.cuda.synchronize before the first block and after the
last); the median block over --steps (as bench/train_step_cuda). fp32 GEMMs without TF32, as
kiln's (torch.backends.cuda.matmul.allow_tf32 = False, PyTorch's default, set explicitly).

Without torch, or (--device cuda) without a CUDA device torch can use, it prints one JSON line
{"bench": "train_step", "backend": "torch_<device>", "skipped": "<why>"} and exits 0; with
--device cuda and KILN_REQUIRE_DEVICE set to anything but "" or "0" (the GPU check sets it) it
prints the reason as a FAILED line on stderr instead and exits 2.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--batches", default="64,256,1024")
ap.add_argument("--warmup", type=int, default=30)
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
ap.add_argument("--reps", type=int, default=11, help="cuda: timed blocks of --steps steps")
args = ap.parse_args()
backend = "torch_" + args.device


def skip(reason):
    required = os.environ.get("KILN_REQUIRE_DEVICE", "") not in ("", "0")
    if args.device == "cuda" and required:
        print(f"torch_train_step.py: FAILED — KILN_REQUIRE_DEVICE is set and {reason}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    print(json.dumps({"bench": "train_step", "backend": backend, "skipped": reason}), flush=True)
    raise SystemExit(0)


try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
    skip(f"torch not importable ({type(e).__name__}: {e}) with {sys.executable}")
if args.device == "cuda":
    if not torch.cuda.is_available():
        why = "torch has no CUDA device"
        if torch.version.cuda is None:
            why += f" (torch {torch.__version__} is a CPU-only build)"
        else:
            why += f" (torch {torch.__version__}, CUDA {torch.version.cuda}; torch.cuda.is_available() is False)"
        skip(why)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

torch.set_num_threads(args.threads)
# torch.set_num_threads does not reach OpenBLAS (Debian's torch links it via libblas.so.3).
for so in {l.split()[-1] for l in open("/proc/self/maps") if "openblas" in l and ".so" in l}:
    ctypes.CDLL(so).openblas_set_num_threads(args.threads)
torch.manual_seed(0)

dev = torch.device(args.device)
for batch in (int(b) for b in args.batches.split(",")):
    model = torch.nn.Sequential(
        torch.nn.Linear(400, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.rand(batch, 400, device=dev), torch.randint(0, 10, (batch,), device=dev)

    def step():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []  # milliseconds per step
    if args.device == "cuda":
        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(args.reps):
            start.record()
            for _ in range(args.steps):
                step()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / args.steps)
        torch.cuda.synchronize()
    else:
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            step()
            if i >= args.warmup:
                times.append(1e3 * (time.perf_counter() - t0))
    line = {"bench": "train_step", "backend": backend, "batch": batch,
            "torch_ms": round(statistics.median(times), 4), "threads": args.threads, "torch": torch.__version__}
    if args.device == "cuda":
        line.update(device=torch.cuda.get_device_name(), steps=args.steps, reps=args.reps, warmup=args.warmup,
                    tf32=False, cuda=torch.version.cuda)
    print(json.dumps(line), flush=True)
