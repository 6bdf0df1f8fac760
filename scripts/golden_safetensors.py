#!/usr/bin/env python3
"""Write tests/fixtures/torch_mlp.safetensors: a state dict as PyTorch saves it, for kiln to read.

Model: torch.nn.Sequential(Linear(12,16), ReLU, Linear(16,8), ReLU, Linear(8,4)) with PyTorch's
default init (seed 0), saved with safetensors.torch.save_file(model.state_dict()) plus two extra
tensors the test reads: "input" [5, 12] and the model's "logits" [5, 4] for it. kiln's test loads
the state dict (non-strict, as the extras are not parameters) into the same kiln Sequential and
checks its logits against these within 1e-5 (tests/cpu/test_checkpoint.cpp).

Run with a python that has torch and safetensors:
  .venv-bench/bin/python scripts/golden_safetensors.py [out_path]
"""
import os
import sys

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "torch_mlp.safetensors")


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 4))
    x = torch.randn(5, 12)
    with torch.no_grad():
        logits = model(x)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    tensors["input"] = x
    tensors["logits"] = logits
    save_file(tensors, OUT, metadata={"format": "pt", "torch": torch.__version__})
    print("wrote", OUT)


if __name__ == "__main__":
    main()
