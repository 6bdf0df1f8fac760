#!/usr/bin/env python3
"""Write tests/fixtures/golden_batchnorm.txt: float64 reference values for BatchNorm2d
(same block format as golden_ops.txt, values printed with '%.17g' so float64 round-trips).

BatchNorm2d(2, eps=1e-5, momentum=0.1) on x [3, 2, 3, 4]: training-mode forward (batch
statistics, running-stat update with the unbiased variance), eval-mode forward with the
updated running statistics, and the training-mode backward for a given dy.

Run with: .venv-bench/bin/python scripts/golden_batchnorm.py [out_path]
"""
import os
import sys

import torch
import torch.nn.functional as F

from golden_ops import block  # the fixture format, written one way

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "golden_batchnorm.txt")
D = torch.float64
EPS, MOMENTUM = 1e-5, 0.1


def main():
    torch.manual_seed(0)  # draws in order: x, gamma, beta, running_mean, running_var, dy
    n, c, h, w = 3, 2, 3, 4
    x = torch.randn(n, c, h, w, dtype=D) * 1.5 + 0.5
    gamma = torch.randn(c, dtype=D)
    beta = torch.randn(c, dtype=D)
    rm0 = torch.randn(c, dtype=D) * 0.1
    rv0 = torch.rand(c, dtype=D) + 0.5
    dy = torch.randn(n, c, h, w, dtype=D)

    rm, rv = rm0.clone(), rv0.clone()
    xs = x.clone().requires_grad_(True)
    gs = gamma.clone().requires_grad_(True)
    bs = beta.clone().requires_grad_(True)
    y = F.batch_norm(xs, rm, rv, gs, bs, training=True, momentum=MOMENTUM, eps=EPS)
    y.backward(dy)
    y_eval = F.batch_norm(x, rm, rv, gamma, beta, training=False, momentum=MOMENTUM, eps=EPS)

    with open(OUT, "w") as f:
        f.write(f"# golden_batchnorm.py, torch {torch.__version__}, float64; format: name rank dims... / values\n")
        for name, t in (("bn.x", x), ("bn.gamma", gamma), ("bn.beta", beta),
                        ("bn.running_mean0", rm0), ("bn.running_var0", rv0), ("bn.dy", dy),
                        ("bn.train.y", y), ("bn.train.running_mean", rm), ("bn.train.running_var", rv),
                        ("bn.eval.y", y_eval), ("bn.dx", xs.grad), ("bn.dgamma", gs.grad),
                        ("bn.dbeta", bs.grad)):
            block(f, name, t)
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
