#!/usr/bin/env python3
"""Checkpoint interop with PyTorch in both directions (issue 11), on the digits MLP.

1. kiln -> PyTorch: `train_digits --epochs 3 --checkpoint-dir W/kiln` trains; PyTorch reads its
   final checkpoint with safetensors.torch.load_file, drops the training state (keys under
   "optimizer."), loads the rest into torch.nn.Sequential(Linear(400,256), ReLU, Linear(256,128),
   ReLU, Linear(128,10)) with load_state_dict(strict=True) and must reach the test accuracy kiln
   printed (the same predictions: at most one test digit may flip on a near-tie).
2. PyTorch -> kiln: PyTorch perturbs those weights, saves its state_dict() with
   safetensors.torch.save_file and computes its accuracy on digits 0-4 and 5-9; `finetune_digits
   --checkpoint FILE --epochs 0` loads the file and must print the same accuracies.
(The logits-within-1e-5 check of a PyTorch-saved state dict runs in the CPU suite on
tests/fixtures/torch_mlp.safetensors, which needs no torch.)

Exits 77 ("skipped") when torch or safetensors does not import.
  python scripts/torch_interop.py --train-digits build/examples/train_digits
      --finetune-digits build/examples/finetune_digits --data-dir data --work-dir /tmp/interop
"""
import argparse
import glob
import gzip
import os
import re
import shutil
import subprocess
import sys

try:
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file
except Exception as e:  # noqa: BLE001 - any import failure means "cannot run here"
    print(f"skipped: torch / safetensors / numpy do not import ({e})")
    sys.exit(77)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_digits(data_dir):
    """digits20 standardised exactly as kiln's fit_normalizer (global, population std, float32)."""
    def part(split):
        x = read_idx(os.path.join(data_dir, f"digits20-{split}-images-idx3-ubyte.gz")).reshape(-1, 400)
        y = read_idx(os.path.join(data_dir, f"digits20-{split}-labels-idx1-ubyte.gz")).astype(np.int64)
        return x.astype(np.float32) * np.float32(1.0 / 255), y
    xtr, _ = part("train")
    xte, yte = part("test")
    mean = xtr.astype(np.float64).mean()
    sd = np.sqrt(((xtr.astype(np.float64) - mean) ** 2).mean())
    mean32, inv32 = np.float32(mean), np.float32(1.0 / sd)
    return torch.from_numpy((xte - mean32) * inv32), torch.from_numpy(yte)


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(400, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


def accuracy(model, x, y, digits=None):
    with torch.no_grad():
        pred = model(x).argmax(1)
    if digits is not None:
        keep = torch.isin(y, torch.tensor(digits))
        pred, y = pred[keep], y[keep]
    return (pred == y).float().mean().item(), int((pred == y).sum()), len(y)


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-digits", required=True)
    ap.add_argument("--finetune-digits", required=True)
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--work-dir", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work_dir, ignore_errors=True)
    os.makedirs(a.work_dir)
    x, y = load_digits(a.data_dir)
    ok = True

    # 1. kiln -> PyTorch
    out = run([a.train_digits, "--data-dir", a.data_dir, "--epochs", "3", "--checkpoint-dir",
               os.path.join(a.work_dir, "kiln")])
    kiln_acc = float(re.search(r"final test accuracy ([0-9.]+)", out).group(1))
    newest = sorted(glob.glob(os.path.join(a.work_dir, "kiln", "step-*.safetensors")))[-1]
    state = {k: v for k, v in load_file(newest).items() if not k.startswith("optimizer.")}
    model = mlp()
    model.load_state_dict(state, strict=True)
    torch_acc, right, n = accuracy(model, x, y)
    same = abs(torch_acc - kiln_acc) <= 1.0 / n + 5e-5  # kiln prints 4 decimals
    ok &= same
    print(f"kiln -> torch: {os.path.basename(newest)}: kiln test accuracy {kiln_acc:.4f}, "
          f"PyTorch on the same weights {torch_acc:.4f} ({right}/{n}) {'OK' if same else 'MISMATCH'}")

    # 2. PyTorch -> kiln
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    path = os.path.join(a.work_dir, "from_torch.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path, metadata={"format": "pt"})
    out = run([a.finetune_digits, "--data-dir", a.data_dir, "--checkpoint", path, "--epochs", "0"])
    m = re.search(r"pretrained: test accuracy ([0-9.]+) on digits 0-4, ([0-9.]+) on digits 5-9", out)
    if m is None:
        print("torch -> kiln: finetune_digits did not print its pretrained accuracies:\n" + out)
        return 1
    for digits, printed in (([0, 1, 2, 3, 4], float(m.group(1))), ([5, 6, 7, 8, 9], float(m.group(2)))):
        acc, right, n = accuracy(model, x, y, digits)
        same = abs(acc - printed) <= 1.0 / n + 5e-5
        ok &= same
        print(f"torch -> kiln: digits {digits[0]}-{digits[-1]}: PyTorch {acc:.4f} ({right}/{n}), kiln loading "
              f"PyTorch's file {printed:.4f} {'OK' if same else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
