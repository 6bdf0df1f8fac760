#!/usr/bin/env python3
"""Write tests/fixtures/golden_gpt.safetensors: a tiny GPT's reference step in PyTorch, float32, in
llm.c's manner (test_gpt2.c): the initial weights under nanoGPT's state-dict names, a batch,
the logits, the loss, every parameter's gradient, and the losses of 10 AdamW steps on that batch
(betas 0.9 / 0.99, lr 1e-2, weight decay 0.1 on the matrices only, gradients clipped to norm 1.0).

Model (scripts/gpt_reference.py): vocabulary 65, block 16, 2 layers, 2 heads, width 32; batch 4,
T 16. Reference tensors are stored under "ref." (ids and labels as float32 / int32).

Run with a Python that has torch and safetensors: .venv-bench/bin/python scripts/golden_gpt.py [out]
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import GPT  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "golden_gpt.safetensors")
VOCAB, BLOCK, LAYERS, HEADS, WIDTH, BATCH = 65, 16, 2, 2, 32, 4


def main():
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = GPT(VOCAB, BLOCK, LAYERS, HEADS, WIDTH)
    # The state dict as PyTorch gives it (both names of the tied table), each tensor its own copy:
    # safetensors stores no shared tensors.
    tensors = {name: t.detach().clone().contiguous() for name, t in model.state_dict().items()}
    x = torch.randint(0, VOCAB, (BATCH, BLOCK))
    y = torch.randint(0, VOCAB, (BATCH, BLOCK))
    tensors["ref.x"] = x.to(torch.float32)
    tensors["ref.y"] = y.to(torch.int32)

    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
    loss.backward()
    tensors["ref.logits"] = logits.detach().clone()
    tensors["ref.loss"] = loss.detach().reshape(1).clone()
    for name, p in model.named_parameters():
        tensors["ref.grad." + name] = p.grad.detach().clone()

    opt = model.optimizer(lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99))
    losses = []
    for _ in range(10):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    tensors["ref.losses"] = torch.tensor(losses, dtype=torch.float32)
    save_file(tensors, OUT, metadata={"made_by": "scripts/golden_gpt.py", "torch": torch.__version__})
    print("wrote", OUT, "loss", tensors["ref.loss"].item(), "after 10 steps", losses[-1])


if __name__ == "__main__":
    main()
