#!/usr/bin/env python3
"""JAX training step for MLP 400-256-128-10 (ReLU), the step of bench/torch_train_step.py as ONE
jax.jit: forward, softmax cross-entropy (mean), grad, AdamW update (lr 1e-3, betas 0.9/0.999,
eps 1e-8, weight_decay 1e-2 as torch's AdamW; written in plain jax, no optax). Parameters and
optimizer state are donated, so XLA updates them in place as kiln and torch do. Init as
torch.nn.Linear (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases), random inputs and
labels; --warmup steps (compilation is in the first), then the median of --steps steps, each
timed up to block_until_ready. One JSON line per batch:
{"bench": "train_step", "backend": "jax_cpu", "peer": "jax_jit", "variant": "jit", "batch",
 "jax_ms", "threads", "jax", "jaxlib", "thread_limit", "cpu_per_wall"}.

Threads: the process's CPU affinity is cut to --threads CPUs while jax starts its CPU client (what
taskset does; XLA sizes its thread pools from the CPUs it may run on), then restored, so that the
pool keeps --threads threads but the scheduler may move them as it does kiln's unpinned OpenMP
threads (staying pinned to CPU 0 loses whenever another process lands there). Measured on the
2-core machine, 1024² matmul: the default used 1.87 CPU seconds per wall second, a 1-CPU affinity
1.00; XLA_FLAGS=--xla_cpu_multi_thread_eigen=false alone still ran the thunk pool on both CPUs
and was slower. cpu_per_wall (process CPU over wall seconds in the timed loop) on every line
shows the limit held: at most about --threads (less when the machine is busy).
Without jax it prints {"bench": "train_step", "backend": "jax_cpu", "peer": "jax_jit", "skipped":
"<why>"} and exits 0.
"""
import argparse
import json
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--batches", default="64,256,1024")
ap.add_argument("--warmup", type=int, default=30)
ap.add_argument("--steps", type=int, default=300)
args = ap.parse_args()
base = {"bench": "train_step", "backend": "jax_cpu", "peer": "jax_jit"}


def skip(reason):
    print(json.dumps({**base, "skipped": reason}), flush=True)
    raise SystemExit(0)


thread_limit = "none (all CPUs)"
cpus = None
try:
    cpus = os.sched_getaffinity(0)
    if args.threads < len(cpus):
        os.sched_setaffinity(0, sorted(cpus)[:args.threads])
        thread_limit = f"XLA pools sized under affinity to {args.threads} CPU(s), affinity restored"
except (AttributeError, OSError) as e:
    thread_limit = f"not limited ({type(e).__name__}: {e})"
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a jax with GPU support must not pick the GPU here

try:
    import jax
    import jax.numpy as jnp
    import jaxlib
    jax.devices()  # starts the CPU client, and its thread pools, under the cut affinity
except Exception as e:  # noqa: BLE001 - any import failure means "no jax here"
    skip(f"jax not importable ({type(e).__name__}: {e}) with {sys.executable}")
finally:
    try:
        if cpus:
            os.sched_setaffinity(0, cpus)
    except OSError:
        pass

LR, B1, B2, EPS, WD = 1e-3, 0.9, 0.999, 1e-8, 1e-2


def init(key):
    params = []
    for fan_in, fan_out in ((400, 256), (256, 128), (128, 10)):
        key, kw, kb = jax.random.split(key, 3)
        bound = 1.0 / fan_in ** 0.5
        params.append((jax.random.uniform(kw, (fan_in, fan_out), jnp.float32, -bound, bound),
                       jax.random.uniform(kb, (fan_out,), jnp.float32, -bound, bound)))
    return params


def loss_fn(params, x, y):
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i + 1 < len(params):
            h = jax.nn.relu(h)
    logp = jax.nn.log_softmax(h)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def step(params, m, v, t, x, y):
    loss, g = jax.value_and_grad(loss_fn)(params, x, y)
    t = t + 1
    m = jax.tree_util.tree_map(lambda m, g: B1 * m + (1 - B1) * g, m, g)
    v = jax.tree_util.tree_map(lambda v, g: B2 * v + (1 - B2) * g * g, v, g)
    c1, c2 = 1 - B1 ** t, 1 - B2 ** t
    params = jax.tree_util.tree_map(
        lambda p, m, v: p * (1 - LR * WD) - LR * (m / c1) / (jnp.sqrt(v / c2) + EPS), params, m, v)
    return params, m, v, t, loss


try:
    jstep = jax.jit(step, donate_argnums=(0, 1, 2, 3))
    for batch in (int(b) for b in args.batches.split(",")):
        kp, kx, ky = jax.random.split(jax.random.PRNGKey(batch), 3)
        params = init(kp)
        m = jax.tree_util.tree_map(jnp.zeros_like, params)
        v = jax.tree_util.tree_map(jnp.zeros_like, params)
        t = jnp.zeros((), jnp.float32)
        x = jax.random.uniform(kx, (batch, 400), jnp.float32)
        y = jax.random.randint(ky, (batch,), 0, 10)
        times = []
        c0 = w0 = 0.0
        for i in range(args.warmup + args.steps):
            if i == args.warmup:
                c0, w0 = time.process_time(), time.perf_counter()
            t0 = time.perf_counter()
            params, m, v, t, loss = jstep(params, m, v, t, x, y)
            jax.block_until_ready(params)
            if i >= args.warmup:
                times.append(1e3 * (time.perf_counter() - t0))
        cpu_per_wall = (time.process_time() - c0) / (time.perf_counter() - w0)
        print(json.dumps({**base, "variant": "jit", "batch": batch, "jax_ms": round(statistics.median(times), 4),
                          "threads": args.threads, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
                          "steps": args.steps, "warmup": args.warmup, "loss": round(float(loss), 4),
                          "thread_limit": thread_limit, "cpu_per_wall": round(cpu_per_wall, 2)}), flush=True)
except Exception as e:  # noqa: BLE001 - a failing peer is reported, never fatal
    skip(f"{type(e).__name__}: {str(e).strip()[:300]} (jax {jax.__version__})")
