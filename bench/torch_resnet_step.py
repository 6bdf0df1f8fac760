#!/usr/bin/env python3
"""PyTorch's ResNet training step on the CPU, the peer of kiln's bench/resnet50_step (and of the
resnet18_step, resnet18_32_step and resnet50_32_step builds of it): the same model
(torchvision.models.resnet50 or resnet18 by --model, num_classes=10, --size x --size RGB: 224 by
default, 32 as CIFAR's images), random images and labels (fixed
seed), cross-entropy (mean), backward, AdamW (lr 1e-3, torch's default implementation),
zero_grad(set_to_none=True). Full training (--train-from conv1) or fine-tuning (--train-from
layer4: conv1, bn1 and layer1-3 frozen — requires_grad False, their BatchNorm2d layers in eval mode,
set again after every model.train() — and AdamW over the trainable parameters only, as
bench/torch_finetune_resnet.py and kiln's freeze do). --precision bf16_mixed runs forward and
loss under torch.autocast("cpu", dtype=torch.bfloat16) (float parameters and optimizer, bf16
convolutions and matmuls: oneDNN's AVX512-BF16 / AMX kernels where the CPU has them), the peer
of kiln's bf16_mixed policy.

Each configuration — variant (eager: plain; compiled: torch.compile of forward + loss, and of
opt.step, dynamic=False, compiled in the warm-up) x memory format (contiguous; channels_last: the
model and the images converted) — runs in a fresh process of this script, so its peak resident
memory (ru_maxrss) is its own: parameters, gradients, AdamW state, the step's activations and
whatever torch keeps. One warm-up step (two for compiled), then --steps timed steps; the median.

  .venv-bench/bin/python bench/torch_resnet_step.py [--batch 8] [--threads 1] [--steps 3]
      [--train-from conv1|layer4] [--variants eager,compiled] [--formats contiguous,channels_last]
      [--precision fp32|bf16_mixed] [--model resnet50|resnet18] [--size 224]

Output, JSON lines: {"bench": "resnet50_step", "backend": "torch_cpu", "peer": "torch_<variant>" or
"torch_<variant>_channels_last", "variant", "memory_format", "model", "size", "batch", "threads", "train_from",
"precision", "step_ms", "images_per_s", "peak_rss_mib", "steps", "torch"}; a configuration that fails prints
a "skipped" line with the reason. Without torch or torchvision: one "skipped" line, exit 0."""
import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--train-from", default="conv1", choices=("conv1", "layer4"))
ap.add_argument("--variants", default="eager,compiled")
ap.add_argument("--formats", default="contiguous,channels_last")
ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16_mixed"))
ap.add_argument("--model", default="resnet50", choices=("resnet50", "resnet18"))
ap.add_argument("--size", type=int, default=224)
ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # variant:format, run in this process
args = ap.parse_args()

if not args.one:  # the parent: one child process per configuration
    for variant in args.variants.split(","):
        for fmt in args.formats.split(","):
            cmd = [sys.executable, __file__, "--one", f"{variant}:{fmt}", "--batch", str(args.batch), "--threads",
                   str(args.threads), "--steps", str(args.steps), "--train-from", args.train_from,
                   "--precision", args.precision, "--model", args.model, "--size", str(args.size)]
            out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False).stdout
            sys.stdout.write(out)
            sys.stdout.flush()
            if '"skipped"' in out and "not importable" in out:
                raise SystemExit(0)  # no torch: said once
    raise SystemExit(0)

variant, fmt = args.one.split(":")
peer = "torch_" + variant + ("_channels_last" if fmt == "channels_last" else "")
head = {"bench": "resnet50_step", "backend": "torch_cpu", "peer": peer, "variant": variant, "memory_format": fmt,
        "model": args.model, "size": args.size, "batch": args.batch, "threads": args.threads, "train_from": args.train_from, "precision": args.precision}

from torch_peer_common import import_torch, limit_threads, make_skip  # noqa: E402

skip = make_skip("resnet50_step", "torch_resnet_step.py", "torch_cpu", "cpu")
torch = import_torch("cpu", skip)
try:
    import torchvision
except Exception as e:  # noqa: BLE001 - no torchvision: this peer cannot run
    skip(f"torchvision not importable ({type(e).__name__}: {e})")
import torch.nn.functional as F  # noqa: E402

limit_threads(args.threads)
torch.manual_seed(0)
model = getattr(torchvision.models, args.model)(num_classes=10)
frozen = []
if args.train_from == "layer4":
    frozen = [model.conv1, model.bn1, model.layer1, model.layer2, model.layer3]
    for m in frozen:
        m.requires_grad_(False)
x = torch.randn(args.batch, 3, args.size, args.size)
y = torch.randint(0, 10, (args.batch,))
if fmt == "channels_last":
    model = model.to(memory_format=torch.channels_last)
    x = x.to(memory_format=torch.channels_last)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def train_mode():
    model.train()
    for m in frozen:  # frozen batch norms keep their running statistics
        m.eval()


def loss_fn(x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16_mixed"):
        return F.cross_entropy(model(x), y)


opt_step = opt.step
try:
    if variant == "compiled":
        torch._dynamo.reset()
        loss_fn = torch.compile(loss_fn, dynamic=False)
        opt_step = torch.compile(opt.step, dynamic=False)

    def step():
        train_mode()
        loss_fn(x, y).backward()
        opt_step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2 if variant == "compiled" else 1):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - t0))
except Exception as e:  # noqa: BLE001 - a variant this torch cannot run is reported, not fatal
    msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    print(json.dumps({**head, "skipped": f"{type(e).__name__}: {msg} (torch {torch.__version__})"}), flush=True)
    raise SystemExit(0)
ms = statistics.median(times)
print(json.dumps({**head, "step_ms": round(ms, 2), "images_per_s": round(args.batch / (ms / 1e3), 2),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  "steps": args.steps, "torch": torch.__version__}), flush=True)
