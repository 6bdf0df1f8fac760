#!/usr/bin/env python3
"""PyTorch training step for two convnets, the peer of kiln's bench/convnet: model.train(),
forward, cross-entropy (mean), backward, AdamW (lr 1e-3) step, zero_grad(set_to_none=True).
Random inputs (torch.randn) and random labels in [0, 10), fixed seed, default PyTorch init; a
few warmup steps, then each step timed on its own and the median reported. One JSON line per
model, batch size and variant. Run: .venv-bench/bin/python bench/torch_convnet.py

Models (--models, default both), inputs flat as kiln's examples feed them:
  digits_cnn   [B, 400] (20x20 grey digits) -> Unflatten(1, 20, 20); Conv2d(1, 16, 3, pad 1),
               BatchNorm2d, ReLU, MaxPool2d(2); Conv2d(16, 32, 3, pad 1), BatchNorm2d, ReLU,
               MaxPool2d(2); Flatten; Linear(800, 128), ReLU; Linear(128, 10). Its lines add
               epoch_s = median step seconds * ceil(4000 / batch): an epoch of the digits20
               training set (4,000 images), how the kiln example is compared.
  resnet9_w32  [B, 3072] (3x32x32 CIFAR-10) -> Unflatten(3, 32, 32); cbr(3, 32); cbr(32, 64);
               MaxPool2d(2); Residual(cbr(64, 64), cbr(64, 64)); cbr(64, 128); MaxPool2d(2);
               cbr(128, 256); MaxPool2d(2); Residual(cbr(256, 256), cbr(256, 256));
               AdaptiveAvgPool2d(1); Flatten; Linear(256, 10). cbr(a, b) = Conv2d(a, b, 3, pad 1,
               bias) + BatchNorm2d(b) + ReLU; Residual(...) is x + body(x).

Variants (--variants, default eager,compiled), as in bench/torch_train_step.py:
  eager        AdamW with torch's default implementation (on CPU tensors the per-tensor loop).
  compiled     torch.compile of the forward + loss function (AOTAutograd compiles its backward
               too; BatchNorm's running-stat updates are part of the graph) and
               torch.compile(opt.step); dynamic=False, a fresh compile per model and batch, inside
               the warmup steps (outside the timing). zero_grad stays eager.
A variant this torch cannot run (too old, no C++ compiler for inductor) prints
{"bench": "convnet", "backend": "torch_cpu", "peer": "torch_<variant>", "variant": ..., "skipped": "<why>"}
once (with the model and batch where it failed) and the other variants go on.

Timing: --warmup steps (default 3), then steps are timed until --seconds (default 1.0) of wall
time have gone by, at least 3 and at most --max-steps (default 100); median_ms is the median step,
images_per_s = batch / median seconds. --device cuda: the same loop with torch.cuda.synchronize
before and after each step (host timing, launch overhead included); TF32 off for matmul and
cuDNN, as kiln computes in fp32.

--precision bf16_mixed runs forward and loss under torch.autocast(dtype=torch.bfloat16) (float
parameters and AdamW; bf16 convolutions and matmuls: oneDNN's AVX512-BF16 / AMX kernels where
the CPU has them), the peer of kiln's bf16_mixed (bench/convnet_bf16); lines carry "precision".

Threads (--threads, default 1) and the provenance fields (blas, backends, threadpools,
cpu_per_wall: process CPU seconds over wall seconds in the timed loop, about --threads when the
threads are busy, above it when the limit did not hold) come from bench/torch_peer_common.py,
shared with bench/torch_train_step.py.

Without torch, or (--device cuda) without a CUDA device torch can use, it prints one JSON line
{"bench": "convnet", "backend": "torch_<device>", "peer": "torch", "skipped": "<why>"} and exits 0;
with --device cuda and KILN_REQUIRE_DEVICE set to anything but "" or "0" it prints the reason as a
FAILED line on stderr instead and exits 2.
"""
import argparse
import json
import math
import os
import statistics
import time

MODELS = ("digits_cnn", "resnet9_w32")
EPOCH_IMAGES = {"digits_cnn": 4000}  # the digits20 training set

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--batches", default="64,256")
ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ",".join(MODELS))
ap.add_argument("--variants", default="eager,compiled", help="comma list of eager,compiled")
ap.add_argument("--seconds", type=float, default=1.0, help="rough wall-time budget of the timed steps")
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--max-steps", type=int, default=100)
ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
ap.add_argument("--precision", choices=("fp32", "bf16_mixed"), default="fp32")
args = ap.parse_args()
backend = "torch_" + args.device
models = args.models.split(",")
variants = args.variants.split(",")
batches = [int(b) for b in args.batches.split(",")]
for name in models:
    if name not in MODELS:
        ap.error(f"unknown model {name!r} (have {', '.join(MODELS)})")
for variant in variants:
    if variant not in ("eager", "compiled"):
        ap.error(f"unknown variant {variant!r} (have eager, compiled)")
# Inductor's pool of compile workers would sit beside the timed loop on a small machine.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


from torch_peer_common import import_torch, limit_threads, make_skip, torch_backends  # noqa: E402

skip = make_skip("convnet", "torch_convnet.py", backend, args.device)
torch = import_torch(args.device, skip)
import torch.nn.functional as F  # noqa: E402 - torch imports (import_torch checked it)
from torch import nn  # noqa: E402

threadpools = limit_threads(args.threads)
blas, backends = torch_backends()
dev = torch.device(args.device)


class Residual(nn.Module):
    def __init__(self, *layers):
        super().__init__()
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.body(x)


def conv_bn_relu(a, b):
    return [nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU()]


def build(name):
    """(model, flat input features) for one of MODELS."""
    if name == "digits_cnn":
        return nn.Sequential(
            nn.Unflatten(1, (1, 20, 20)),
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10)), 400
    return nn.Sequential(
        nn.Unflatten(1, (3, 32, 32)),
        *conv_bn_relu(3, 32), *conv_bn_relu(32, 64), nn.MaxPool2d(2),
        Residual(*conv_bn_relu(64, 64), *conv_bn_relu(64, 64)),
        *conv_bn_relu(64, 128), nn.MaxPool2d(2),
        *conv_bn_relu(128, 256), nn.MaxPool2d(2),
        Residual(*conv_bn_relu(256, 256), *conv_bn_relu(256, 256)),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10)), 3072


def make_step(name, variant, batch):
    torch.manual_seed(0)  # the same init and data for every variant
    model, features = build(name)
    model = model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, features, device=dev), torch.randint(0, 10, (batch,), device=dev)

    def loss_fn(x, y):
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16_mixed"):
            return F.cross_entropy(model(x), y)

    opt_step = opt.step
    if variant == "compiled":
        if not hasattr(torch, "compile"):
            raise RuntimeError("this torch has no torch.compile")
        torch._dynamo.reset()  # a fresh compile per model and batch; the old graphs go
        loss_fn = torch.compile(loss_fn, dynamic=False)
        opt_step = torch.compile(opt.step, dynamic=False)

    def step():
        model.train()
        loss_fn(x, y).backward()
        opt_step()
        opt.zero_grad(set_to_none=True)

    return step


def time_steps(step):
    """Milliseconds per step (the median), timed steps, process CPU seconds over wall seconds."""
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    times = []
    c0, w0 = time.process_time(), time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - w0 < args.seconds and len(times) < args.max_steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times), len(times), (time.process_time() - c0) / (time.perf_counter() - w0)


for variant in variants:
    failed = False
    for name in models:
        for batch in batches:
            try:
                ms, steps, cpu_per_wall = time_steps(make_step(name, variant, batch))
            except Exception as e:  # noqa: BLE001 - a variant this torch cannot run is skipped, not fatal
                msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
                print(json.dumps({"bench": "convnet", "backend": backend, "peer": "torch_" + variant,
                                  "variant": variant, "model": name, "batch": batch,
                                  "skipped": f"{type(e).__name__}: {msg} (torch {torch.__version__})"}), flush=True)
                failed = True
                break
            line = {"bench": "convnet", "backend": backend, "peer": "torch_" + variant, "variant": variant,
                    "model": name, "batch": batch, "threads": args.threads, "precision": args.precision,
                    "median_ms": round(ms, 4),
                    "images_per_s": round(batch / (ms / 1e3), 1)}
            if name in EPOCH_IMAGES:
                line["epoch_s"] = round(ms / 1e3 * math.ceil(EPOCH_IMAGES[name] / batch), 4)
            line.update(steps=steps, warmup=args.warmup, torch=torch.__version__)
            if args.device == "cuda":
                line.update(device=torch.cuda.get_device_name(), tf32=False, cuda=torch.version.cuda)
            else:
                line.update(cpu_per_wall=round(cpu_per_wall, 2), blas=blas, backends=backends,
                            threadpools=threadpools)
            print(json.dumps(line), flush=True)
        if failed:
            break
