#!/usr/bin/env python3
"""Write tests/fixtures/golden_mlp.txt: float32 reference values for a small MLP.

Model: Linear(12,16) -> ReLU -> Linear(16,8) -> GELU(erf) -> Linear(8,4), batch 5,
loss = cross_entropy(label_smoothing=0.1, mean). Stores inputs, initial parameters,
loss and gradients, then three AdamW steps (lr 1e-2, wd 0.01) on the same batch.

Run with Debian's python: /usr/bin/python3 scripts/golden_mlp.py [out_path]
"""
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "golden_mlp.txt")


def block(f, name, t):
    """`name rank dims...` then one line of values ('%.9g' is exact for float32)."""
    t = torch.as_tensor(t).detach()
    f.write(" ".join([name, str(t.dim())] + [str(d) for d in t.shape]) + "\n")
    fmt = "%d" if not t.is_floating_point() else "%.9g"
    f.write(" ".join(fmt % v for v in t.reshape(-1).tolist()) + "\n")


def main():
    torch.manual_seed(0)  # one generator: parameters first (default init), then x, then labels
    layers = [torch.nn.Linear(12, 16), torch.nn.Linear(16, 8), torch.nn.Linear(8, 4)]
    x = torch.randn(5, 12)
    labels = torch.randint(0, 4, (5,))
    params = [(f"l{i}.{k}", getattr(l, k)) for i, l in enumerate(layers) for k in ("weight", "bias")]

    def loss_fn():
        h = F.relu(layers[0](x))
        h = F.gelu(layers[1](h))  # approximate='none' (erf form)
        return F.cross_entropy(layers[2](h), labels, label_smoothing=0.1, reduction="mean")

    with open(OUT, "w") as f:
        f.write(f"# golden_mlp.py, torch {torch.__version__}, float32; format: name rank dims... / values\n")
        block(f, "x", x)
        block(f, "labels", labels)
        for n, p in params:
            block(f, n, p)
        loss = loss_fn()
        loss.backward()
        block(f, "loss0", loss)
        for n, p in params:
            block(f, "grad." + n, p.grad)

        opt = torch.optim.AdamW([p for _, p in params], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        for step in range(1, 4):
            opt.zero_grad()
            loss = loss_fn()
            loss.backward()
            block(f, f"adamw.loss{step}", loss)  # loss before step `step`
            opt.step()
        for n, p in params:
            block(f, "adamw." + n, p)
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
