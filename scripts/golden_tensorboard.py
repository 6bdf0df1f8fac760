"""Golden bytes for tests/cpu/test_tensorboard.cpp: TensorBoard's own protobuf classes and record
writer encode two events; the test checks that kiln's hand encoder writes the same bytes.

    .venv-bench/bin/python scripts/golden_tensorboard.py   # prints the hex the test embeds
"""
import io

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter


def framed(event):
    buf = io.BytesIO()
    RecordWriter(buf).write(event.SerializeToString())
    return buf.getvalue().hex()


header = event_pb2.Event(wall_time=1234.5, step=0, file_version="brain.Event:2")
scalars = event_pb2.Event(wall_time=1234.75, step=7, summary=summary_pb2.Summary(value=[
    summary_pb2.Summary.Value(tag="train/loss", simple_value=0.25),
    summary_pb2.Summary.Value(tag="train/lr", simple_value=0.001),
]))
print("header ", framed(header))
print("scalars", framed(scalars))
