#!/usr/bin/env python3
"""PyTorch eager CPU training step for MLP 400-256-128-10 (ReLU): forward, cross-entropy,
backward, AdamW step, zero_grad(set_to_none=True). Random inputs; warmup, then the median
over many steps. One JSON line per batch size. Run: /usr/bin/python3 bench/torch_train_step.py
"""
import argparse
import ctypes
import json
import statistics
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--batches", default="64,256,1024")
ap.add_argument("--warmup", type=int, default=30)
ap.add_argument("--steps", type=int, default=300)
args = ap.parse_args()

try:
    import torch
    import torch.nn.functional as F
except Exception:  # noqa: BLE001 - any import failure means "no torch here"
    print(json.dumps({"bench": "train_step", "backend": "torch_cpu", "skipped": "torch not importable"}))
    raise SystemExit(0)

torch.set_num_threads(args.threads)
# torch.set_num_threads does not reach OpenBLAS (Debian's torch links it via libblas.so.3).
for so in {l.split()[-1] for l in open("/proc/self/maps") if "openblas" in l and ".so" in l}:
    ctypes.CDLL(so).openblas_set_num_threads(args.threads)
torch.manual_seed(0)

for batch in (int(b) for b in args.batches.split(",")):
    model = torch.nn.Sequential(
        torch.nn.Linear(400, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.rand(batch, 400), torch.randint(0, 10, (batch,))
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"bench": "train_step", "backend": "torch_cpu", "batch": batch,
                      "torch_ms": round(1e3 * statistics.median(times), 4),
                      "threads": args.threads, "torch": torch.__version__}), flush=True)
