#!/usr/bin/env python3
"""ResNet-50 weights between torchvision and kiln, both ways (issue 29).

1. torchvision -> kiln: torchvision.models.resnet50() from a fixed seed (its batch norms given
   random affine parameters and running statistics, so eval mode has something to get right) is
   saved with safetensors.torch.save_file(model.state_dict()); `resnet_logits` loads it into
   kiln::models::ResNet50<1000> with no mapping and computes the eval logits of 2 random images.
   They must match PyTorch's within 1e-4 of the largest |logit|.
2. kiln -> torchvision: the weights resnet_logits saved load into a fresh torchvision resnet50
   with load_state_dict(strict=True) and reproduce PyTorch's own logits (the same values went
   round: within 1e-6 of the largest).

Exits 77 ("skipped") when torch, torchvision or safetensors does not import.
  python scripts/torch_resnet_interop.py --bin build/tests/resnet_logits --work-dir /tmp/resnet_interop
"""
import argparse
import os
import subprocess
import sys

try:
    import torch
    import torchvision
    from safetensors.torch import load_file, save_file
except Exception as e:  # noqa: BLE001 - any import failure means "cannot run here"
    print(f"skipped: torch / torchvision / safetensors do not import ({e})")
    sys.exit(77)


def reference_model(seed):
    torch.manual_seed(seed)
    model = torchvision.models.resnet50(weights=None)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
                m.num_batches_tracked.fill_(7)
    return model.eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the resnet_logits program")
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    os.makedirs(a.work_dir, exist_ok=True)
    torch.set_num_threads(a.threads)
    weights = os.path.join(a.work_dir, "torchvision_resnet50.safetensors")
    images = os.path.join(a.work_dir, "images.safetensors")
    logits_path = os.path.join(a.work_dir, "kiln_logits.safetensors")
    kiln_weights = os.path.join(a.work_dir, "kiln_resnet50.safetensors")

    model = reference_model(seed=29)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
    torch.manual_seed(1)
    x = torch.randn(2, 3, 224, 224)
    save_file({"images": x}, images)
    with torch.no_grad():
        ref = model(x)

    subprocess.run([a.bin, "--weights", weights, "--input", images, "--output", logits_path,
                    "--save-weights", kiln_weights, "--threads", str(a.threads)], check=True)
    got = load_file(logits_path)["logits"]
    scale = ref.abs().max().item()
    err = (got - ref).abs().max().item() / scale
    print(f"torchvision -> kiln: eval logits of 2 images, max |kiln - torch| / max |logit| = {err:.2e} "
          f"(max |logit| {scale:.3f}; limit 1e-4)")
    ok = err <= 1e-4

    back = torchvision.models.resnet50(weights=None).eval()
    back.load_state_dict(load_file(kiln_weights), strict=True)
    with torch.no_grad():
        again = back(x)
    err_back = (again - ref).abs().max().item() / scale
    print(f"kiln -> torchvision: load_state_dict(strict=True) of kiln's saved weights, logits differ by {err_back:.2e} "
          f"of the largest (limit 1e-6)")
    ok = ok and err_back <= 1e-6
    print("torch_resnet_interop: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
