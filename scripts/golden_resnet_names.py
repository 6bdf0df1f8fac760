#!/usr/bin/env python3
"""Write tests/fixtures/resnet_state_names.txt: the state_dict of torchvision's resnet18 and
resnet50 as `model name dtype dims...` lines, in state_dict order. The CPU suite checks that
kiln::models::ResNet18 / ResNet50 walk to exactly these names, shapes and dtypes, so a
torchvision state_dict loads into them with no mapping (the weights themselves are too large to
commit; scripts/torch_resnet_interop.py checks the values where torch is installed).

Run with: .venv-bench/bin/python scripts/golden_resnet_names.py [out_path]
"""
import os
import sys

import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "resnet_state_names.txt")
DTYPES = {torch.float32: "F32", torch.int64: "I64"}


def main():
    lines = [f"# golden_resnet_names.py, torch {torch.__version__}, torchvision {torchvision.__version__}; "
             "format: model name dtype dims..."]
    for arch in ("resnet18", "resnet50"):
        model = getattr(torchvision.models, arch)(weights=None)
        for name, t in model.state_dict().items():
            dims = " ".join(str(d) for d in t.shape)
            lines.append(f"{arch} {name} {DTYPES[t.dtype]} {dims}".rstrip())
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {OUT}: {len(lines) - 1} tensors")


if __name__ == "__main__":
    main()
