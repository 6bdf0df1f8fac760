#!/usr/bin/env python3
"""PyTorch training step for MLP 400-256-128-10 (ReLU): forward, cross-entropy, backward, AdamW
(lr 1e-3) step, zero_grad(set_to_none=True). Random inputs; warmup, then the median over many
steps. One JSON line per variant and batch size. Run: .venv-bench/bin/python bench/torch_train_step.py

Variants (--variants, default eager,eager_fused,compiled on the CPU and eager on CUDA):
  eager        AdamW with torch's default implementation (on CPU tensors that is the per-tensor
               loop; foreach is torch's default only on CUDA). The variant measured before.
  eager_fused  AdamW(fused=True): one fused kernel over all parameters (CPU support since 2.4).
  compiled     torch.compile, the pattern PyTorch's tutorials recommend: the forward + loss
               function compiled (AOTAutograd compiles its backward graph too) and
               torch.compile(opt.step) for the optimizer. Not one compiled function around the
               whole step: loss.backward() inside it breaks the graph anyway (without compiled
               autograd), which would give the same graphs plus the break's overhead. dynamic=False
               and a fresh compile per batch (the shapes are static); zero_grad stays eager (it only
               sets .grad to None). Compilation happens in the warmup steps, outside the timing.
A variant this torch cannot run (too old, no C++ compiler for inductor) prints
{"bench": "train_step", "backend": "torch_cpu", "peer": "torch_<variant>", "variant": ..., "skipped": "<why>"}
once and the others go on.

Threads: torch.set_num_threads (intra-op OpenMP, and MKL in pip wheels), plus
threadpoolctl.threadpool_limits for any other BLAS/OpenMP pool it sees when threadpoolctl imports;
otherwise each loaded OpenBLAS/MKL/BLIS library's own set-threads symbol, when it exports one
(Debian's torch calls OpenBLAS through libblas.so.3, which torch.set_num_threads does not reach).
Every line reports blas (torch's BLAS_INFO), backends (from torch.__config__.show()), threadpools
(threadpoolctl's view after the limits, or the symbols set) and cpu_per_wall (process CPU seconds
over wall seconds in the timed loop: about --threads when the threads are busy, above it when the
limit did not hold).

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
import json
import os
import statistics
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--batches", default="64,256,1024")
ap.add_argument("--warmup", type=int, default=30)
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
ap.add_argument("--reps", type=int, default=11, help="cuda: timed blocks of --steps steps")
ap.add_argument("--variants", default=None, help="comma list of eager,eager_fused,compiled")
args = ap.parse_args()
backend = "torch_" + args.device
variants = (args.variants or ("eager" if args.device == "cuda" else "eager,eager_fused,compiled")).split(",")
# Inductor's pool of compile workers would sit beside the timed loop on a small machine.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


from torch_peer_common import import_torch, limit_threads, make_skip, torch_backends  # noqa: E402

skip = make_skip("train_step", "torch_train_step.py", backend, args.device)
torch = import_torch(args.device, skip)
import torch.nn.functional as F  # noqa: E402 - torch imports (import_torch checked it)


threadpools = limit_threads(args.threads)
blas, backends = torch_backends()
torch.manual_seed(0)
dev = torch.device(args.device)


def make_step(variant, batch):
    model = torch.nn.Sequential(
        torch.nn.Linear(400, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **({"fused": True} if variant == "eager_fused" else {}))
    x, y = torch.rand(batch, 400, device=dev), torch.randint(0, 10, (batch,), device=dev)

    def loss_fn(x, y):
        return F.cross_entropy(model(x), y)

    opt_step = opt.step
    if variant == "compiled":
        if not hasattr(torch, "compile"):
            raise RuntimeError("this torch has no torch.compile")
        torch._dynamo.reset()  # a fresh compile per batch; the old model's graphs go
        loss_fn = torch.compile(loss_fn, dynamic=False)
        opt_step = torch.compile(opt.step, dynamic=False)

    def step():
        loss_fn(x, y).backward()
        opt_step()
        opt.zero_grad(set_to_none=True)

    return step


def time_steps(step):
    """Milliseconds per step (the median) and process CPU seconds over wall seconds."""
    times = []
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
        return statistics.median(times), None
    for _ in range(args.warmup):
        step()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times), (time.process_time() - c0) / (time.perf_counter() - w0)


for variant in variants:
    for batch in (int(b) for b in args.batches.split(",")):
        try:
            ms, cpu_per_wall = time_steps(make_step(variant, batch))
        except Exception as e:  # noqa: BLE001 - a variant this torch cannot run is skipped, not fatal
            msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            print(json.dumps({"bench": "train_step", "backend": backend, "peer": "torch_" + variant, "variant": variant,
                              "skipped": f"{type(e).__name__}: {msg} (torch {torch.__version__})"}), flush=True)
            break
        line = {"bench": "train_step", "backend": backend, "peer": "torch_" + variant, "variant": variant,
                "batch": batch, "torch_ms": round(ms, 4), "threads": args.threads, "torch": torch.__version__}
        if args.device == "cuda":
            line.update(device=torch.cuda.get_device_name(), steps=args.steps, reps=args.reps, warmup=args.warmup,
                        tf32=False, cuda=torch.version.cuda)
        else:
            line.update(steps=args.steps, warmup=args.warmup, cpu_per_wall=round(cpu_per_wall, 2), blas=blas,
                        backends=backends, threadpools=threadpools)
        print(json.dumps(line), flush=True)
