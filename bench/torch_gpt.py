"""PyTorch's side of kiln's GPT: nanoGPT's model (scripts/gpt_reference.py: the same names, init and
parameter groups as kiln::models::GPT) at nanoGPT's CPU configuration (vocab 65, block 64, 4 layers,
4 heads, width 128, batch 12, AdamW lr 1e-3 / beta2 0.99 / weight decay 0.1 on the matrices,
gradients clipped at 1.0, 100 warmup iterations and a cosine to 1e-4, no dropout).

--mode step (bench/gpt_step runs it): one training iteration timed — a batch of random windows,
  forward, cross-entropy, backward, clip_grad_norm_, AdamW, zero_grad — median over --steps after
  --warmup; one JSON line per variant:
    eager        nanoGPT's loop as it runs with --compile=False (AdamW's default implementation);
    eager_fused  the same with AdamW(fused=True);
    compiled     torch.compile(model) (nanoGPT's --compile=True) and torch.compile(opt.step).
--mode train: nanoGPT's whole run on data/tinyshakespeare.txt.gz (the same 90% / 10% split,
  estimate_loss over --eval-iters batches every 250 iterations), printing the losses and
  `final val loss X` — the figure examples/train_gpt is compared with.

Without torch it prints one JSON line {"bench": "gpt_step", "peer": "torch", "skipped": why} and exits 0.
Run: .venv-bench/bin/python bench/torch_gpt.py [--mode step|train] [--threads 1] [--variants ...]
"""
import argparse
import gzip
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=("step", "train"), default="step")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--warmup", type=int, default=20)
ap.add_argument("--steps", type=int, default=100)
ap.add_argument("--variants", default="eager,eager_fused,compiled")
ap.add_argument("--iters", type=int, default=2000)
ap.add_argument("--eval-iters", type=int, default=20)
ap.add_argument("--data", default=os.path.join(HERE, "..", "data", "tinyshakespeare.txt.gz"))
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

from torch_peer_common import import_torch, limit_threads, make_skip, torch_backends  # noqa: E402

skip = make_skip("gpt_step", "torch_gpt.py", "torch_cpu", "cpu")
torch = import_torch("cpu", skip)
import torch.nn.functional as F  # noqa: E402

from gpt_reference import GPT  # noqa: E402

VOCAB, BLOCK, LAYERS, HEADS, WIDTH, BATCH = 65, 64, 4, 4, 128, 12
LR, MIN_LR, WARMUP, WEIGHT_DECAY, BETAS, CLIP = 1e-3, 1e-4, 100, 0.1, (0.9, 0.99), 1.0
threadpools = limit_threads(args.threads)
blas, backends = torch_backends()


def get_lr(it, total):
    """nanoGPT's get_lr."""
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    if it > total:
        return MIN_LR
    ratio = (it - WARMUP) / max(total - WARMUP, 1)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def batches(data, gen):
    """nanoGPT's get_batch: random windows of BLOCK + 1 tokens."""
    while True:
        ix = torch.randint(len(data) - BLOCK, (BATCH,), generator=gen)
        x = torch.stack([data[i:i + BLOCK] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + BLOCK] for i in ix])
        yield x, y


def make_iteration(variant, model, opt, data, gen):
    fwd = model
    opt_step = opt.step
    if variant == "compiled":
        torch._dynamo.reset()
        fwd = torch.compile(model, dynamic=False)
        opt_step = torch.compile(opt.step, dynamic=False)
    source = batches(data, gen)

    def iteration():
        x, y = next(source)
        logits = fwd(x)
        loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt_step()
        opt.zero_grad(set_to_none=True)
        return loss

    return iteration


def step_mode():
    gen = torch.Generator().manual_seed(args.seed)
    data = torch.randint(0, VOCAB, (100_000,), generator=gen)
    for variant in args.variants.split(","):
        torch.manual_seed(args.seed)
        model = GPT(VOCAB, BLOCK, LAYERS, HEADS, WIDTH)
        opt = model.optimizer(lr=LR, weight_decay=WEIGHT_DECAY, betas=BETAS)
        if variant == "eager_fused":
            opt = torch.optim.AdamW(opt.param_groups, lr=LR, betas=BETAS, fused=True)
        try:
            iteration = make_iteration(variant, model, opt, data, gen)
            for _ in range(args.warmup):
                iteration()
            times = []
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(args.steps):
                t0 = time.perf_counter()
                iteration()
                times.append(1e3 * (time.perf_counter() - t0))
            cpu_per_wall = (time.process_time() - c0) / (time.perf_counter() - w0)
        except Exception as e:  # noqa: BLE001 - a variant this torch cannot run is skipped, not fatal
            msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            print(json.dumps({"bench": "gpt_step", "peer": "torch_" + variant, "skipped": f"{type(e).__name__}: {msg}"}),
                  flush=True)
            continue
        print(json.dumps({"bench": "gpt_step", "backend": "torch_cpu", "peer": "torch_" + variant, "variant": variant,
                          "threads": args.threads, "torch_ms": round(statistics.median(times), 4),
                          "steps": args.steps, "warmup": args.warmup, "cpu_per_wall": round(cpu_per_wall, 2),
                          "torch": torch.__version__, "blas": blas, "backends": backends,
                          "threadpools": threadpools}), flush=True)


def train_mode():
    text = gzip.open(args.data, "rb").read().decode("utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(ids))
    train, val = ids[:n], ids[n:]
    torch.manual_seed(args.seed)
    model = GPT(VOCAB, BLOCK, LAYERS, HEADS, WIDTH)
    opt = model.optimizer(lr=LR, weight_decay=WEIGHT_DECAY, betas=BETAS)
    gen = torch.Generator().manual_seed(args.seed)
    eval_gen = torch.Generator().manual_seed(args.seed + 1)
    iteration = make_iteration(args.variants.split(",")[0], model, opt, train, gen)

    @torch.no_grad()
    def estimate(split):
        model.eval()
        source = batches(split, eval_gen)
        losses = [F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1)).item() for x, y in
                  (next(source) for _ in range(args.eval_iters))]
        model.train()
        return sum(losses) / len(losses)

    times = []
    val_loss = float("nan")
    for it in range(args.iters + 1):
        if it % 250 == 0 or it == args.iters:
            val_loss = estimate(val)
            ms = statistics.median(times) if times else float("nan")
            print(f"iter {it:5d}: train loss {estimate(train):.4f}, val loss {val_loss:.4f}, {ms:.2f} ms per iteration",
                  flush=True)
        if it == args.iters:
            break
        for g in opt.param_groups:
            g["lr"] = get_lr(it, args.iters)
        t0 = time.perf_counter()
        iteration()
        times.append(1e3 * (time.perf_counter() - t0))
    print(f"final val loss {val_loss:.4f}; median {statistics.median(times):.2f} ms per iteration "
          f"(torch {torch.__version__}, {args.variants.split(',')[0]}, {args.threads} thread{'s' if args.threads > 1 else ''})")


if args.mode == "step":
    step_mode()
else:
    train_mode()
