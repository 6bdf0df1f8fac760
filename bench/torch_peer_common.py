"""What the PyTorch peers of kiln's benchmarks share (bench/torch_train_step.py,
bench/torch_convnet.py): thread limits that reach every pool, and the backends torch was built with.
Imported after torch; never run on its own."""
import ctypes
import os
import re

import torch


def limit_threads(n):
    """Limits every thread pool we can reach to n; returns what was limited, never raises."""
    torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
        limit_threads.keep = threadpool_limits(limits=n)  # keep the object: it holds the limits
        return ",".join(f"{p['internal_api']}({p['prefix']})={p['num_threads']}" for p in threadpool_info())
    except Exception:  # noqa: BLE001 - no threadpoolctl, or it failed: fall back to the symbols
        pass
    done = []
    libs = set()
    try:
        libs = {l.split()[-1] for l in open("/proc/self/maps") if re.search(r"openblas|mkl_rt|blis|libblas", l)}
    except OSError:
        pass
    for so in sorted(libs):
        for sym in ("openblas_set_num_threads", "openblas_set_num_threads64_", "scipy_openblas_set_num_threads64_",
                    "MKL_Set_Num_Threads", "bli_thread_set_num_threads"):
            try:
                getattr(ctypes.CDLL(so), sym)(n)
                done.append(f"{os.path.basename(so)}:{sym}={n}")
                break
            except (OSError, AttributeError):
                continue
    return ",".join(done) or "torch.set_num_threads only"


def torch_backends():
    """BLAS_INFO and a one-line summary of torch.__config__.show()."""
    try:
        cfg = torch.__config__.show()
    except Exception:  # noqa: BLE001
        return "unknown", "unknown"
    blas = re.search(r"BLAS_INFO=(\w+)", cfg)
    parts = []
    for label, pat in (("MKL", r"Math Kernel Library Version ([\d.]+)"), ("oneDNN", r"MKL-DNN (v[\d.]+)"),
                       ("OpenMP", r"OpenMP (\d+)"), ("CPU", r"CPU capability usage: (\w+)")):
        m = re.search(pat, cfg)
        if m:
            parts.append(f"{label} {m.group(1)}")
    if "USE_NNPACK=ON" in cfg:
        parts.append("NNPACK")
    return (blas.group(1) if blas else "unknown"), ", ".join(parts)
