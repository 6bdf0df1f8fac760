#!/usr/bin/env python3
"""Write tests/fixtures/golden_optim_skip.txt: torch.optim steps where some parameters have no
gradient (.grad None) on some steps, float64, same block format as golden_ops.txt.

Three parameters a [3], b [2], c [4]; four steps; the parameters with a gradient at each step
are {a, b}, {a, c}, {a, b, c}, {b} (so b skips step 2, c starts at step 2, a skips step 4).
Run with Debian's python: /usr/bin/python3 scripts/golden_optim_skip.py [out_path]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "golden_optim_skip.txt")
D = torch.float64
SIZES = {"a": 3, "b": 2, "c": 4}
ACTIVE = [("a", "b"), ("a", "c"), ("a", "b", "c"), ("b",)]
OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1),
    "sgd_nesterov_wd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1),
    "adam_amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, amsgrad=True),
}


def block(f, name, t):
    t = torch.as_tensor(t).detach()
    f.write(" ".join([name, str(t.dim())] + [str(d) for d in t.shape]) + "\n")
    fmt = "%d" if not t.is_floating_point() else "%.17g"
    f.write(" ".join(fmt % v for v in t.reshape(-1).tolist()) + "\n")


def main():
    torch.manual_seed(0)
    p0 = {n: torch.randn(k, dtype=D) for n, k in SIZES.items()}
    # Large early gradients, then small ones: amsgrad's running max then differs from v.
    grads = {n: torch.randn(len(ACTIVE), k, dtype=D) * torch.tensor([[2.0], [1.0], [0.1], [0.05]], dtype=D)
             for n, k in SIZES.items()}

    f = open(OUT, "w")
    f.write(f"# golden_optim_skip.py, torch {torch.__version__}, float64; format: name rank dims... / values\n")
    block(f, "skip.active", torch.tensor([[int(n in act) for n in SIZES] for act in ACTIVE]))
    for n in SIZES:
        block(f, f"skip.p0.{n}", p0[n])
        block(f, f"skip.grad.{n}", grads[n])
    for name, make in OPTIMIZERS.items():
        ps = {n: p0[n].clone().requires_grad_(True) for n in SIZES}
        opt = make(list(ps.values()))
        rows = {n: [] for n in SIZES}
        for s, act in enumerate(ACTIVE):
            opt.zero_grad(set_to_none=True)
            for n in act:
                ps[n].grad = grads[n][s].clone()
            opt.step()
            for n in SIZES:
                rows[n].append(ps[n].detach().clone())
        for n in SIZES:
            block(f, f"skip.{name}.{n}", torch.stack(rows[n]))
    f.close()


if __name__ == "__main__":
    main()
