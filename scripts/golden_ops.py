#!/usr/bin/env python3
"""Write tests/fixtures/golden_ops.txt: float64 reference values for single ops,
optimizer steps and learning-rate schedules (same block format as golden_mlp.txt,
values printed with '%.17g' so float64 round-trips exactly).

Run with Debian's python: /usr/bin/python3 scripts/golden_ops.py [out_path]
"""
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "golden_ops.txt")
D = torch.float64


def block(f, name, t):
    t = torch.as_tensor(t).detach()
    f.write(" ".join([name, str(t.dim())] + [str(d) for d in t.shape]) + "\n")
    fmt = "%d" if not t.is_floating_point() else "%.17g"
    f.write(" ".join(fmt % v for v in t.reshape(-1).tolist()) + "\n")


def grad_of(fn, *inputs, upstream=None):
    """Value of fn(*inputs) and d(sum(upstream * fn))/d(inputs)."""
    xs = [t.detach().clone().requires_grad_(True) for t in inputs]
    y = fn(*xs)
    y.backward(torch.ones_like(y) if upstream is None else upstream)
    return [y.detach()] + [t.grad for t in xs]


def main():
    torch.manual_seed(0)
    x = torch.randn(3, 5, dtype=D) * 2  # logits / LayerNorm input
    target = torch.tensor([1, 0, 4])
    ln_w = torch.randn(5, dtype=D)
    ln_b = torch.randn(5, dtype=D)
    ln_dy = torch.randn(3, 5, dtype=D)
    pts = torch.tensor([-30, -6, -3, -1.5, -1, -0.5, -1e-3, 0, 1e-3, 0.5, 1, 1.5, 3, 6, 19.5, 20, 20.5, 30], dtype=D)

    f = open(OUT, "w")
    f.write(f"# golden_ops.py, torch {torch.__version__}, float64; format: name rank dims... / values\n")

    block(f, "x", x)
    block(f, "log_softmax", F.log_softmax(x, dim=-1))

    block(f, "ce.target", target)
    for ls, tag in ((0.0, "ce"), (0.1, "ce_ls0.1")):
        for red in ("mean", "sum"):
            y, dx = grad_of(lambda z: F.cross_entropy(z, target, label_smoothing=ls, reduction=red), x)
            block(f, f"{tag}.{red}", y)
            block(f, f"{tag}.{red}.dlogits", dx)

    block(f, "ln.weight", ln_w)
    block(f, "ln.bias", ln_b)
    block(f, "ln.dy", ln_dy)
    y, dx, dw, db = grad_of(lambda z, w, b: F.layer_norm(z, (5,), w, b, eps=1e-5), x, ln_w, ln_b, upstream=ln_dy)
    for n, v in (("ln.y", y), ("ln.dx", dx), ("ln.dweight", dw), ("ln.dbias", db)):
        block(f, n, v)

    block(f, "act.x", pts)
    acts = {
        "gelu": lambda z: F.gelu(z),
        "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
        "softplus": lambda z: F.softplus(z, beta=1, threshold=20),
        "silu": F.silu,
    }
    for n, fn in acts.items():
        y, dy = grad_of(fn, pts)
        block(f, n, y)
        block(f, n + ".d", dy)

    # Optimizers: fixed parameter vector, fixed gradient sequence; row k = parameter after step k+1.
    p0 = torch.tensor([0.5, -1.0, 0.0, 2.0, -0.25], dtype=D)
    grads = torch.tensor([[0.1, -0.2, 0.3, 0.0, 1.0],
                          [-0.05, 0.4, 0.3, 0.01, -2.0],
                          [0.2, 0.0, -0.1, 0.5, 0.5]], dtype=D)
    block(f, "opt.p0", p0)
    block(f, "opt.grads", grads)
    opts = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
        "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=1e-2),
    }
    for n, make in opts.items():
        p = p0.clone().requires_grad_(True)
        opt, rows = make([p]), []
        for g in grads:
            p.grad = g.clone()
            opt.step()
            rows.append(p.detach().clone())
        block(f, n + ".p", torch.stack(rows))

    # Schedules: lr (and momentum) in effect at steps 0..N-1.
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=20)
    lrs, moms = [], []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        moms.append(opt.param_groups[0]["momentum"])
        opt.step()
        sched.step()
    block(f, "onecycle.lr", torch.tensor(lrs, dtype=D))
    block(f, "onecycle.momentum", torch.tensor(moms, dtype=D))

    opt = torch.optim.SGD([p], lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10, eta_min=0.001)
    lrs = []
    for _ in range(11):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    block(f, "cosine.lr", torch.tensor(lrs, dtype=D))
    f.close()
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
