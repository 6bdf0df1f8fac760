"""What the PyTorch peers of kiln's benchmarks share (bench/torch_train_step.py,
bench/torch_convnet.py): the "skipped" line, importing torch (and checking CUDA), thread limits
that reach every pool, and the backends torch was built with. Never run on its own; it imports
torch only when asked (import_torch), so a missing torch becomes a skip line."""
import ctypes
import json
import os
import re
import sys

torch = None  # set by import_torch


def make_skip(bench, script, backend, device):
    """skip(reason): prints {"bench", "backend", "peer": "torch", "skipped": reason} and exits 0; with
    --device cuda and KILN_REQUIRE_DEVICE set to anything but "" or "0", a FAILED line on stderr and
    exit 2 instead."""
    def skip(reason):
        required = os.environ.get("KILN_REQUIRE_DEVICE", "") not in ("", "0")
        if device == "cuda" and required:
            print(f"{script}: FAILED — KILN_REQUIRE_DEVICE is set and {reason}", file=sys.stderr, flush=True)
            raise SystemExit(2)
        print(json.dumps({"bench": bench, "backend": backend, "peer": "torch", "skipped": reason}), flush=True)
        raise SystemExit(0)
    return skip


def import_torch(device, skip):
    """torch, or skip() with why not: not importable, or (device "cuda") no CUDA device it can use.
    On CUDA, TF32 is turned off for matmul and cuDNN (kiln's peers compute in fp32)."""
    global torch
    try:
        import torch as t
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
        skip(f"torch not importable ({type(e).__name__}: {e}) with {sys.executable}")
    torch = t
    if device == "cuda":
        if not t.cuda.is_available():
            why = "torch has no CUDA device"
            if t.version.cuda is None:
                why += f" (torch {t.__version__} is a CPU-only build)"
            else:
                why += f" (torch {t.__version__}, CUDA {t.version.cuda}; torch.cuda.is_available() is False)"
            skip(why)
        t.backends.cuda.matmul.allow_tf32 = False
        t.backends.cudnn.allow_tf32 = False
    return t


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
