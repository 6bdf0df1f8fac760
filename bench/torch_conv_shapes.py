#!/usr/bin/env python3
"""PyTorch's own CPU convolution (aten.convolution / aten.convolution_backward, which call oneDNN)
on the shapes bench/conv_shapes hands it, the peer of kiln's convolution kernels. Each shape in
channels_last (the peer of kiln's nhwc) and contiguous (nchw) memory format, without bias:
forward, backward_data (the input's gradient only) and backward_filter (the weight's only).
Random inputs, fixed seed; one warm-up call, then calls are timed until --seconds have gone by
(at least 3, at most 200) and the median reported.

  .venv-bench/bin/python bench/torch_conv_shapes.py --rows 'c_in,hw,c_out,k,stride,pad,count;...'
      [--batch 8] [--threads 1] [--ops forward,backward_data,backward_filter] [--seconds 0.5]

Output, JSON lines: one "versions" line, then per row, op and memory format
{"bench": "conv_shapes", "backend": "torch_cpu", "peer": "torch_channels_last" | "torch_contiguous",
 "row": i, "op": ..., "batch", "threads", "median_ms", "calls"}. The stem's backward_data (c_in 3)
is left out, as kiln's side leaves it out. Without torch: one "skipped" line, exit 0."""
import argparse
import json
import statistics
import time

ap = argparse.ArgumentParser()
ap.add_argument("--rows", required=True)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--ops", default="forward,backward_data,backward_filter")
ap.add_argument("--seconds", type=float, default=0.5)
args = ap.parse_args()

from torch_peer_common import import_torch, limit_threads, make_skip, torch_backends  # noqa: E402

skip = make_skip("conv_shapes", "torch_conv_shapes.py", "torch_cpu", "cpu")
torch = import_torch("cpu", skip)
threadpools = limit_threads(args.threads)
blas, backends = torch_backends()
torch.manual_seed(0)
print(json.dumps({"bench": "conv_shapes", "backend": "torch_cpu", "peer": "torch", "torch": torch.__version__,
                  "mkldnn": torch.backends.mkldnn.is_available(), "blas": blas, "backends": backends,
                  "threadpools": threadpools}), flush=True)


def median_ms(f):
    f()
    times, spent = [], 0.0
    while len(times) < 3 or (len(times) < 200 and spent < args.seconds):
        t0 = time.perf_counter()
        f()
        dt = time.perf_counter() - t0
        spent += dt
        times.append(dt * 1e3)
    return statistics.median(times), len(times)


aten = torch.ops.aten
formats = {"torch_channels_last": torch.channels_last, "torch_contiguous": torch.contiguous_format}
with torch.no_grad():
    for i, row in enumerate(args.rows.split(";")):
        c_in, hw, c_out, k, stride, pad, _count = (int(v) for v in row.split(","))
        for peer, fmt in formats.items():
            x = torch.randn(args.batch, c_in, hw, hw).to(memory_format=fmt)
            w = torch.randn(c_out, c_in, k, k).to(memory_format=fmt)
            y = aten.convolution(x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1)
            dy = torch.randn_like(y).to(memory_format=fmt)
            calls = {
                "forward": lambda: aten.convolution(x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1),
                "backward_data": lambda: aten.convolution_backward(dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1],
                                                                   False, [0, 0], 1, [True, False, False]),
                "backward_filter": lambda: aten.convolution_backward(dy, x, w, None, [stride] * 2, [pad] * 2,
                                                                     [1, 1], False, [0, 0], 1, [False, True, False]),
            }
            for op in args.ops.split(","):
                if op == "backward_data" and c_in == 3:
                    continue
                ms, n = median_ms(calls[op])
                print(json.dumps({"bench": "conv_shapes", "backend": "torch_cpu", "peer": peer, "row": i, "op": op,
                                  "batch": args.batch, "threads": args.threads, "median_ms": round(ms, 4),
                                  "calls": n}), flush=True)
