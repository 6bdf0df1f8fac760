"""Reads a kiln log directory with TensorBoard's own reader (EventAccumulator) and checks that
every expected tag is there with increasing step numbers — the test that TensorBoard shows what
train_digits --log-dir wrote. Exits 77 (skipped) when tensorboard does not import.

    python scripts/read_tensorboard.py LOGDIR --tags train/loss,train/lr --min-steps 20
"""
import argparse
import glob
import os
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    print(f"skipped: tensorboard does not import ({e}); pip install tensorboard to run this check")
    sys.exit(77)

ap = argparse.ArgumentParser()
ap.add_argument("logdir")
ap.add_argument("--tags", required=True, help="comma-separated scalar tags that must be present")
ap.add_argument("--min-steps", type=int, default=1, help="fewest logged steps per tag")
args = ap.parse_args()

files = sorted(glob.glob(os.path.join(args.logdir, "events.out.tfevents.*")))
if not files:
    sys.exit(f"no events.out.tfevents.* file in {args.logdir}")
acc = EventAccumulator(args.logdir, size_guidance={"scalars": 0})  # 0: keep every event
acc.Reload()
found = acc.Tags()["scalars"]
failed = False
for tag in args.tags.split(","):
    if tag not in found:
        print(f"FAIL {tag}: not among the tags TensorBoard read ({sorted(found)})")
        failed = True
        continue
    events = acc.Scalars(tag)
    steps = [e.step for e in events]
    ok = len(steps) >= args.min_steps and all(b > a for a, b in zip(steps, steps[1:]))
    failed |= not ok
    print(f"{'ok  ' if ok else 'FAIL'} {tag}: {len(steps)} points, steps {steps[0]}..{steps[-1]}, "
          f"last value {events[-1].value:.6g}")
# The CSV beside the events holds the same rows.
csv = os.path.join(args.logdir, "scalars.csv")
if os.path.exists(csv):
    with open(csv) as f:
        header = f.readline().strip().split(",")
        rows = sum(1 for _ in f)
    missing = [t for t in args.tags.split(",") if t not in header]
    print(f"{'ok  ' if not missing else 'FAIL'} scalars.csv: {rows} rows, columns {header}")
    failed |= bool(missing)
print(f"tensorboard read {len(files)} event file(s) in {args.logdir}: {'FAILED' if failed else 'all tags present'}")
sys.exit(1 if failed else 0)
