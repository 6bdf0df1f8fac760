#!/usr/bin/env python3
"""Reference PyTorch run on digits20: MLP 400-256-128-10 (ReLU), AdamW lr 1e-3, batch 64,
seed 0, data held in memory as tensors. Prints per-epoch training seconds and test accuracy,
then one JSON line. Run with Debian's python: /usr/bin/python3 scripts/torch_train_digits.py
"""
import argparse
import ctypes
import gzip
import json
import os
import re
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, ndim = int.from_bytes(data[0:4], "big"), data[3]
    assert magic >> 8 == 0x08, f"{path}: not an unsigned-byte IDX file"
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, split):
    img = read_idx(os.path.join(data_dir, f"digits20-{split}-images-idx3-ubyte.gz"))
    lab = read_idx(os.path.join(data_dir, f"digits20-{split}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(img.reshape(len(img), -1).astype(np.float32) / 255.0)
    return x, torch.from_numpy(lab.astype(np.int64))


def set_threads(n):
    """torch.set_num_threads does not reach OpenBLAS (Debian's torch links libblas.so.3 ->
    OpenBLAS, which otherwise uses every core), so pin it too. Returns a BLAS description."""
    torch.set_num_threads(n)
    m = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    blas = m.group(1) if m else "unknown"
    libs = {l.split()[-1] for l in open("/proc/self/maps") if "openblas" in l and ".so" in l}
    if libs:
        lib = ctypes.CDLL(sorted(libs)[0])
        lib.openblas_set_num_threads(n)
        lib.openblas_get_config.restype = ctypes.c_char_p
        blas = " ".join(lib.openblas_get_config().decode().split()[:2]) + f" (BLAS_INFO={blas})"
    return blas


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default="/work/shared/data")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()

    blas = set_threads(args.threads)
    torch.manual_seed(0)
    xtr, ytr = load(args.data_dir, "train")
    xte, yte = load(args.data_dir, "test")
    model = torch.nn.Sequential(
        torch.nn.Linear(400, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    times, acc = [], 0.0
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        perm = torch.randperm(len(xtr))
        for i in range(0, len(xtr), args.batch):  # last partial batch included
            idx = perm[i:i + args.batch]
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        times.append(time.perf_counter() - t0)
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item()
        print(f"epoch {epoch + 1}: {times[-1]:.4f} s, loss {loss.item():.4f}, test acc {acc:.4f}")

    print(json.dumps({"bench": "torch_train_digits", "epochs": args.epochs,
                      "median_epoch_s": round(statistics.median(times), 5),
                      "final_test_acc": round(acc, 4), "threads": args.threads,
                      "torch": torch.__version__, "blas": blas}))


if __name__ == "__main__":
    main()
