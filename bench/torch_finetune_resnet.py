#!/usr/bin/env python3
"""PyTorch's side of kiln's ResNet-50 fine-tuning example (examples/finetune_resnet): the same
data, model, frozen layers, optimizer and schedule, so both report training images/s (and
validation accuracy) in the same run. Per epoch a human line; per variant one JSON line; last the
line `final val accuracy X`.

  .venv-bench/bin/python bench/torch_finetune_resnet.py --data-dir DIR [--weights FILE]
      [--train-from layer4] [--epochs 2] [--batch 128] [--accumulate 1] [--lr 3e-4]
      [--warmup-steps N] [--precision fp32|bf16_mixed] [--variants eager,compiled]
      [--val-fraction 0.2] [--threads 2] [--workers 2] [--seed 0]

Data. --data-dir holds train/ and optionally val/, one folder per class
(torchvision.datasets.ImageFolder, scanning as kiln's data::ImageFolder does: classes are the
sub-folders in byte order, images the .jpg/.jpeg/.png files below each (any case, sub-folders
included), and names starting with '.' are skipped, so a .ipynb_checkpoints is neither a class nor
an image). val/ must have the same classes as train/. Without val/, a stratified split of train/:
each class's images, in label order, are shuffled by torch.randperm from one
torch.Generator(--seed), round(n_c * --val-fraction) of them (at least 1 and at most n_c - 1 when
n_c >= 2) go to validation, and both parts keep scan order. That is kiln's rule
(ImageFolder::split_indices); the generator is torch's, so the same counts per class but not the
same files as kiln's split: for the same images on both sides give a val/ folder.
Transforms: train = RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize(ImageNet
mean/std); eval = Resize(256) + CenterCrop(224) + ToTensor + Normalize.

Model. torchvision.models.resnet50(weights=None) built after torch.manual_seed(--seed);
--weights FILE loads a safetensors state_dict (safetensors.torch.load_file) with strict=True, then
fc becomes a fresh nn.Linear(2048, classes) (drawn from the same RNG stream whether weights were
loaded or not, so the head is the same either way). --train-from NAME (conv1, layer1, layer2,
layer3, layer4, fc; default layer4) freezes every parameter of the top-level modules before NAME
(for layer1 that is conv1 and bn1; for fc everything but fc), and those modules' BatchNorm2d
layers stay in eval mode while training (running statistics untouched), set again after every
model.train().

Optimizer. AdamW (torch's default implementation, weight_decay 0.01, torch's default) over the
trainable parameters only; lr = --lr (3e-4, tuned for batch 32) * sqrt(batch / 32), the sqrt rule
of kiln/optim/batch_scaling.hpp. Linear warmup over --warmup-steps optimizer steps (default 5% of
all optimizer steps, rounded half up, at least 1) counting from step + 1 as kiln's WarmupCosineLr
does (optimizer step s < W runs at lr * (s + 1) / W, so the first step already moves the
weights), then constant. --warmup-steps 0: constant from the start.

Steps. --batch is the effective batch; --accumulate N splits it into N micro-batches of batch / N
(N must divide the batch). The DataLoader yields micro-batches (shuffled by a
torch.Generator(--seed), the last one of an epoch kept even when smaller, as kiln's Loader with
drop_last false); each micro-batch runs forward + cross-entropy (mean), backward of loss / N, and
every N-th micro-batch the optimizer step, the schedule step and zero_grad(set_to_none=True).
Micro-batches are counted over the whole run, as kiln's train::Step counts them: when an epoch's
micro-batches are not a multiple of N, the last partial accumulation carries into the next epoch
(validation in between runs under no_grad and leaves the gradients alone), and one left at the end
of the run is dropped. Optimizer steps in all = floor(epochs * micro-batches per epoch / N); a
run with none is refused. --precision bf16_mixed wraps forward + loss in
torch.autocast("cpu", dtype=torch.bfloat16) (the logits go to float32 for the loss); fp32 runs
without autocast. Validation (model.eval(), no_grad, the same autocast, batches of batch / N) runs
after each epoch.

Variants (--variants, default eager,compiled; each from the same seed, so the same initial weights
and data order): eager, and compiled = torch.compile(model) (default mode; the optimizer stays
eager). Compilation happens on the first forward of the first epoch (again for validation, under
no_grad in eval mode, outside the timing, and for a micro-batch of another size), so it is inside
that epoch's seconds; the median below is kiln's, so with 2 epochs it is the faster (usually the
second) epoch. How long the first epoch takes depends on inductor's on-disk cache
(/tmp/torchinductor_$USER): a later run with the same shapes compiles much faster. If compiling fails, a line
`compiled: torch.compile failed (...); skipping the compiled variant` and a JSON line with
"skipped" are printed and the other variants go on.

Timing. An epoch's seconds run from creating the training DataLoader's iterator to the end of its
last micro-batch (data loading included, validation not), images/s = the epoch's training images
/ those seconds, as kiln's examples measure it; images_per_s_median is kiln's median (the epochs'
rates sorted, the element at index len / 2: the upper one for an even count). --threads sets
torch.set_num_threads (and every BLAS/OpenMP pool threadpoolctl can reach, through
bench/torch_peer_common.py); --workers DataLoader worker processes (persistent across epochs;
0 = load in the main process), each single-threaded as DataLoader makes them. Inductor compiles
with one thread (TORCHINDUCTOR_COMPILE_THREADS=1 unless set) so no compile pool sits beside the
loop.

Output. Per epoch: `<variant> epoch E/N  train loss L  val accuracy A  S s  R images/s` (the loss
is the mean of the epoch's micro-batch losses). Per variant:
{"bench": "torch_finetune_resnet", "variant", "precision", "batch", "accumulate", "threads",
"train_from", "images_per_s_median", "val_accuracy", "peak_rss_mib", ...} then the epochs' rates,
the image counts, workers, torch's version and the thread pools. val_accuracy is after the last
epoch; peak_rss_mib is resource.getrusage(RUSAGE_SELF).ru_maxrss (KiB on Linux) / 1024: the main
process's peak so far (so a later variant's figure is at least an earlier one's; workers not
included). Last, `final val accuracy X` (4 decimals) of the last variant that ran.

Exit codes. Bad input (a missing data dir or train/, no class folders, a class folder without
images, val/ classes unlike train/'s, a --train-from name that does not exist, a batch not
divisible by --accumulate, an unknown variant or precision, a weights file that is missing or does
not load strictly, too few images for one optimizer step): one line `torch_finetune_resnet.py:
error: ...` on stderr and exit 2. Without torch or torchvision (or safetensors when --weights is
given): a JSON line {"bench": "torch_finetune_resnet", "backend": "torch_cpu", "peer": "torch",
"skipped": "<why>"} on stdout, `torch_finetune_resnet.py: skipped: <why>` on stderr, and exit 77
(ctest's skip code, as scripts/torch_resnet_interop.py; bench/torch_convnet.py exits 0 there
instead). No variant ran (all failed to compile): exit 1.
"""
import argparse
import contextlib
import json
import math
import os
import resource
import sys
import time

BENCH = "torch_finetune_resnet"
SCRIPT = "torch_finetune_resnet.py"
STAGES = ("conv1", "layer1", "layer2", "layer3", "layer4", "fc")  # top-level ResNet modules one can train from
VARIANTS = ("eager", "compiled")
EXTENSIONS = (".jpg", ".jpeg", ".png")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BASE_BATCH = 32  # the batch --lr is tuned for


def fail(message):
    print(f"{SCRIPT}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def skip(reason):
    print(json.dumps({"bench": BENCH, "backend": "torch_cpu", "peer": "torch", "skipped": reason}), flush=True)
    print(f"{SCRIPT}: skipped: {reason}", file=sys.stderr, flush=True)
    raise SystemExit(77)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the usage first)
        fail(message)


def parse_args():
    ap = Parser(description="PyTorch peer of kiln's examples/finetune_resnet: ResNet-50 fine-tuning images/s.")
    ap.add_argument("--data-dir", required=True, help="folder with train/ and optionally val/, a folder per class")
    ap.add_argument("--weights", default=None, help="safetensors state_dict of torchvision's resnet50")
    ap.add_argument("--train-from", default="layer4", help="first trained module: " + ", ".join(STAGES))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128, help="effective batch (per optimizer step)")
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate at batch 32 (sqrt-scaled)")
    ap.add_argument("--warmup-steps", type=int, default=None, help="default: 5%% of the optimizer steps, at least 1")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16_mixed"))
    ap.add_argument("--variants", default="eager,compiled", help="comma list of " + ",".join(VARIANTS))
    ap.add_argument("--val-fraction", type=float, default=0.2, help="share of each class held out without val/")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.train_from not in STAGES:
        fail(f"--train-from {a.train_from}: no such module; the names are {', '.join(STAGES)}")
    if a.batch <= 0 or a.accumulate <= 0:
        fail(f"--batch ({a.batch}) and --accumulate ({a.accumulate}) must be positive")
    if a.batch % a.accumulate:
        fail(f"--batch {a.batch} is not divisible by --accumulate {a.accumulate} "
             "(micro-batches are batch / accumulate)")
    if a.epochs <= 0 or a.threads <= 0 or a.workers < 0:
        fail("--epochs and --threads must be positive, --workers >= 0")
    if not (a.lr > 0 and math.isfinite(a.lr)):
        fail(f"--lr {a.lr} must be positive and finite")
    if a.warmup_steps is not None and a.warmup_steps < 0:
        fail(f"--warmup-steps {a.warmup_steps} must be >= 0")
    if not 0.0 < a.val_fraction < 1.0:
        fail(f"--val-fraction {a.val_fraction} must be in (0, 1)")
    a.variants = [v for v in a.variants.split(",") if v]
    for v in a.variants:
        if v not in VARIANTS:
            fail(f"unknown variant {v!r}; the variants are {', '.join(VARIANTS)}")
    if not a.variants:
        fail("--variants is empty")
    if not os.path.isdir(a.data_dir):
        fail(f"--data-dir {a.data_dir}: no such folder")
    if not os.path.isdir(os.path.join(a.data_dir, "train")):
        fail(f"--data-dir {a.data_dir}: no train/ folder in it (train/<class>/<image>, optionally val/<class>/<image>)")
    if a.weights is not None and not os.path.isfile(a.weights):
        fail(f"--weights {a.weights}: no such file")
    return a


def hidden_below(path, root):
    """Whether a file or folder name in path below root starts with '.' (kiln skips those)."""
    return any(part.startswith(".") for part in os.path.relpath(path, root).split(os.sep))


def image_file(root):
    def valid(path):
        return path.lower().endswith(EXTENSIONS) and not hidden_below(path, root)
    return valid


def scan(root, ImageFolder):
    """torchvision's ImageFolder over root with kiln's rules (see the docstring); errors exit 2."""
    class KilnScan(ImageFolder):
        def find_classes(self, directory):
            classes = sorted(e.name for e in os.scandir(directory) if e.is_dir() and not e.name.startswith("."))
            if not classes:
                fail(f"{directory}: no class folders in it")
            return classes, {c: i for i, c in enumerate(classes)}

    folder = KilnScan(root, is_valid_file=image_file(root), allow_empty=True)
    counts = [0] * len(folder.classes)
    for _, label in folder.samples:
        counts[label] += 1
    empty = [c for c, n in zip(folder.classes, counts) if n == 0]
    if empty:
        fail(f"{root}: class folder{'s' if len(empty) > 1 else ''} without images "
             f"({', '.join(os.path.join(root, c) for c in empty)}; images are {', '.join(EXTENSIONS)} files)")
    return folder


def stratified_split(labels, num_classes, fraction, seed, torch):
    """(first, second) index lists: kiln's ImageFolder::split_indices rule with torch's generator."""
    gen = torch.Generator().manual_seed(seed)
    by_class = [[] for _ in range(num_classes)]
    for i, label in enumerate(labels):
        by_class[label].append(i)
    second = set()
    for members in by_class:
        n = len(members)
        order = torch.randperm(n, generator=gen).tolist()
        k = math.floor(n * fraction + 0.5)  # std::llround for a non-negative value
        if n >= 2 and 0.0 < fraction < 1.0:
            k = min(max(k, 1), n - 1)
        second.update(members[j] for j in order[:k])
    return [i for i in range(len(labels)) if i not in second], sorted(second)


class Images:
    """Samples (path, label) read by `loader` and transformed: what the DataLoader workers index."""

    def __init__(self, samples, loader, transform):
        self.samples, self.loader, self.transform = samples, loader, transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        return self.transform(self.loader(path)), label


def state_dict_mismatch(want, got):
    """The keys a strict load_state_dict refuses, counted, the first few of each kind named."""
    def some(names):
        names = sorted(names)
        return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    missing = set(want) - set(got)
    unexpected = set(got) - set(want)
    shape = {k for k in set(want) & set(got) if tuple(want[k].shape) != tuple(got[k].shape)}
    parts = [f"{len(v)} {what} ({some(v)})" for what, v in
             (("missing", missing), ("unexpected", unexpected), ("of another shape", shape)) if v]
    return "; ".join(parts)


def first_line(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


def main():
    args = parse_args()
    # Inductor's pool of compile workers would sit beside the timed loop on a small machine.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_peer_common import import_torch, limit_threads

    torch = import_torch("cpu", skip)
    try:
        import torchvision
        from torchvision import transforms as T
        from torchvision.datasets import ImageFolder
    except Exception as e:  # noqa: BLE001 - any import failure means "cannot run here"
        skip(f"torchvision not importable ({first_line(e)}) with {sys.executable}")
    load_file = None
    if args.weights is not None:
        try:
            from safetensors.torch import load_file
        except Exception as e:  # noqa: BLE001
            skip(f"safetensors not importable ({first_line(e)}) with {sys.executable}; --weights needs it")
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader

    threadpools = limit_threads(args.threads)

    # Data.
    train_root = os.path.join(args.data_dir, "train")
    val_root = os.path.join(args.data_dir, "val")
    train_folder = scan(train_root, ImageFolder)
    classes = train_folder.classes
    if os.path.isdir(val_root):
        val_folder = scan(val_root, ImageFolder)
        if val_folder.classes != classes:
            only_train = sorted(set(classes) - set(val_folder.classes))
            only_val = sorted(set(val_folder.classes) - set(classes))
            fail(f"{val_root}: its classes differ from train/'s (only in train/: {', '.join(only_train) or '-'}; "
                 f"only in val/: {', '.join(only_val) or '-'})")
        train_samples, val_samples = train_folder.samples, val_folder.samples
        val_from = "val/"
    else:
        first, second = stratified_split(train_folder.targets, len(classes), args.val_fraction, args.seed, torch)
        train_samples = [train_folder.samples[i] for i in first]
        val_samples = [train_folder.samples[i] for i in second]
        val_from = f"{args.val_fraction:g} of each train/ class, seed {args.seed}"
    normalize = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    train_set = Images(train_samples, train_folder.loader,
                       T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), normalize]))
    val_set = Images(val_samples, train_folder.loader,
                     T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), normalize]))
    micro = args.batch // args.accumulate
    micro_per_epoch = math.ceil(len(train_set) / micro)
    total_steps = args.epochs * micro_per_epoch // args.accumulate
    if total_steps == 0:
        fail(f"{len(train_set)} training images make {micro_per_epoch} micro-batches of {micro} an epoch: "
             f"{args.epochs} epoch(s) never complete one optimizer step of {args.accumulate} micro-batches")
    warmup = args.warmup_steps if args.warmup_steps is not None else max(1, math.floor(0.05 * total_steps + 0.5))
    lr = args.lr * math.sqrt(args.batch / BASE_BATCH)
    print(f"data: {args.data_dir}: {len(classes)} classes, {len(train_set)} train / {len(val_set)} val images "
          f"(val: {val_from})", flush=True)

    state = None
    if args.weights is not None:
        try:
            state = load_file(args.weights)
        except Exception as e:  # noqa: BLE001 - not a safetensors file
            fail(f"--weights {args.weights}: cannot be read as safetensors ({first_line(e)})")

    def build():
        """(model, frozen BatchNorm2d modules, trainable parameters, frozen module names), from --seed."""
        torch.manual_seed(args.seed)
        model = torchvision.models.resnet50(weights=None)
        if state is not None:
            try:
                model.load_state_dict(state, strict=True)
            except RuntimeError as e:
                fail(f"--weights {args.weights}: not torchvision's resnet50 state_dict (strict load: "
                     f"{state_dict_mismatch(model.state_dict(), state) or ' '.join(str(e).split())[:300]})")
        model.fc = nn.Linear(2048, len(classes))
        frozen = {}
        for name, child in model.named_children():  # conv1, bn1, relu, maxpool, layer1..4, avgpool, fc
            if name == args.train_from:
                break
            child.requires_grad_(False)
            frozen[name] = child
        bns = [m for child in frozen.values() for m in child.modules() if isinstance(m, nn.BatchNorm2d)]
        names = [name for name, child in frozen.items() if list(child.parameters())]
        return model, bns, [p for p in model.parameters() if p.requires_grad], names

    model, bns, trainable, frozen_names = build()
    n_all = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in trainable)
    init = f"weights {args.weights}" if state is not None else f"random init (seed {args.seed})"
    print(f"model: torchvision resnet50, {init}, new fc 2048 -> {len(classes)}; training from {args.train_from}: "
          f"{n_train:,} of {n_all:,} parameters, frozen {', '.join(frozen_names) or 'nothing'} "
          f"({len(bns)} BatchNorm2d in eval mode)", flush=True)
    print(f"optimizer: AdamW lr {lr:.4g} ({args.lr:g} * sqrt({args.batch} / {BASE_BATCH})), weight decay 0.01, "
          f"linear warmup {warmup} of {total_steps} steps, then constant; "
          f"batch {args.batch} = {args.accumulate} x {micro}, {args.precision}", flush=True)
    print(f"device: CPU, {args.threads} thread{'s' if args.threads != 1 else ''} ({threadpools}), "
          f"{args.workers} loader worker{'s' if args.workers != 1 else ''}; torch {torch.__version__}, "
          f"torchvision {torchvision.__version__}", flush=True)
    del model, bns, trainable

    def autocast():
        if args.precision == "bf16_mixed":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def loaders():
        common = dict(batch_size=micro, num_workers=args.workers, persistent_workers=args.workers > 0)
        return (DataLoader(train_set, shuffle=True, generator=torch.Generator().manual_seed(args.seed), **common),
                DataLoader(val_set, shuffle=False, **common))

    def run(variant):
        """Per-epoch lines; returns (rates, last val accuracy)."""
        model, bns, trainable, _ = build()
        net = model
        if variant == "compiled":
            torch._dynamo.reset()
            net = torch.compile(model)

        def train_mode():
            net.train()
            for m in bns:
                m.eval()

        opt = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 1.0 if warmup == 0 else min(1.0, (s + 1) / warmup))
        train_loader, val_loader = loaders()
        rates, accuracy, micro_batches = [], 0.0, 0
        for epoch in range(args.epochs):
            train_mode()
            loss_sum, batches, seen = 0.0, 0, 0
            t0 = time.perf_counter()
            for x, y in train_loader:
                with autocast():
                    loss = F.cross_entropy(net(x).float(), y)
                (loss / args.accumulate).backward()
                micro_batches += 1
                if micro_batches % args.accumulate == 0:
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
                loss_sum += loss.item()
                batches += 1
                seen += len(y)
            seconds = time.perf_counter() - t0
            rates.append(seen / seconds)
            net.eval()
            correct = total = 0
            with torch.no_grad(), autocast():
                for x, y in val_loader:
                    correct += (net(x).argmax(1) == y).sum().item()
                    total += len(y)
            accuracy = correct / total
            print(f"{variant} epoch {epoch + 1}/{args.epochs}  train loss {loss_sum / batches:.4f}  "
                  f"val accuracy {accuracy:.4f}  {seconds:.2f} s  {rates[-1]:.1f} images/s", flush=True)
        del train_loader, val_loader  # ends the persistent workers
        return rates, accuracy

    final = None
    for variant in args.variants:
        try:
            rates, accuracy = run(variant)
        except Exception as e:  # noqa: BLE001 - a failed compile skips the variant; anything else is a bug
            if variant != "compiled":
                raise
            why = f"{first_line(e)} (torch {torch.__version__})"
            print(f"compiled: torch.compile failed ({why}); skipping the compiled variant", flush=True)
            print(json.dumps({"bench": BENCH, "variant": variant, "precision": args.precision, "batch": args.batch,
                              "accumulate": args.accumulate, "threads": args.threads,
                              "train_from": args.train_from, "skipped": why}), flush=True)
            continue
        peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({
            "bench": BENCH, "variant": variant, "precision": args.precision, "batch": args.batch,
            "accumulate": args.accumulate, "threads": args.threads, "train_from": args.train_from,
            "images_per_s_median": round(sorted(rates)[len(rates) // 2], 2),
            "val_accuracy": round(accuracy, 6), "peak_rss_mib": round(peak_rss_mib, 1),
            "images_per_s": [round(r, 2) for r in rates], "epochs": args.epochs,
            "train_images": len(train_set), "val_images": len(val_set), "workers": args.workers,
            "torch": torch.__version__, "threadpools": threadpools}), flush=True)
        final = accuracy
    if final is None:
        print(f"{SCRIPT}: no variant ran", file=sys.stderr, flush=True)
        raise SystemExit(1)
    print(f"final val accuracy {final:.4f}", flush=True)


if __name__ == "__main__":
    main()
