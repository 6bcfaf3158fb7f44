"""TensorBoard event files written a batch of steps at a time, for a few us a step.

An event file is a sequence of records: the length (u64), its masked CRC-32C, an ``Event``
protobuf, its masked CRC-32C. tensorboard's own writer (and torch's ``SummaryWriter`` over it)
builds one ``Event`` per value and checksums it byte by byte in Python: ~130 us a step of 7
metrics, in the thread that competes with training for the GIL. Here a step is one event
with all its values (``simple_value``, as ``add_scalar`` writes them), and the steps of a batch
that have the same metrics are encoded together: a template with each step's wall time, step
and values written in by numpy, and the CRCs computed a column at a time over every event of
the batch. The rare records (file version, purge marker, text) go through tensorboard's
protobufs and its own CRC.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np

from services.worker.trackers.base import StepPoints

# A file is closed and the next one started beyond this size (an s3:// store uploads the file
# being written after each batch: this bounds each upload).
MAX_FILE_BYTES = 8 * 1024 * 1024
MASK_DELTA = 0xA282EAD8
# The last part of a file's name, unique in this process (two attempts of a job in the same
# second get two files); zero-padded so that names sort in the order they were started.
_file_numbers = itertools.count(1)


def _crc_table() -> np.ndarray:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import CRC_TABLE

    return np.array(CRC_TABLE, dtype=np.uint32)


def masked_crc32c(columns: np.ndarray, table: np.ndarray) -> np.ndarray:
    """The masked CRC-32C of each of ``n`` equal-length byte strings, given as an
    ``(length, n)`` uint8 array (a string per column): one pass per byte position."""
    crc = np.full(columns.shape[1], 0xFFFFFFFF, dtype=np.uint32)
    for row in columns:
        crc = table[(crc ^ row) & 0xFF] ^ (crc >> 8)
    crc ^= np.uint32(0xFFFFFFFF)
    return ((crc >> 15) | (crc << 17)) + np.uint32(MASK_DELTA)  # uint32: wraps as the mask does


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def frame(event: bytes) -> bytes:
    """One record around a serialised ``Event`` (the path of the rare records)."""
    header = struct.pack("<Q", len(event))
    return header + struct.pack("<I", _masked(header)) + event + struct.pack("<I", _masked(event))


class ScalarLayout:
    """The record of a step with these metrics (in this order) and a step number of
    ``step_bytes`` varint bytes: a template, and where the variable bytes go."""

    def __init__(self, names: tuple[str, ...], step_bytes: int) -> None:
        values, self.value_at = b"", []
        for name in names:
            tag = name.encode()
            value = b"\x0a" + varint(len(tag)) + tag + b"\x15"
            item = b"\x0a" + varint(len(value) + 4)
            self.value_at.append(len(item) + len(value) + len(values))
            values += item + value + b"\0\0\0\0"
        # Event: wall_time (1, double), step (2, varint), summary (5, message).
        head = b"\x09" + bytes(8) + b"\x10" + bytes(step_bytes) + b"\x2a" + varint(len(values))
        self.value_at = [len(head) + at for at in self.value_at]
        self.step_bytes = step_bytes
        self.event = np.frombuffer(head + values, dtype=np.uint8)
        size = struct.pack("<Q", len(self.event))
        self.header = np.frombuffer(size + struct.pack("<I", _masked(size)), dtype=np.uint8)
        self.length = len(self.header) + len(self.event) + 4

    def records(self, walls: np.ndarray, steps: np.ndarray, values: np.ndarray,
                table: np.ndarray) -> np.ndarray:
        """``(n, length)`` bytes: the records of n steps (values: ``(n, metrics)``)."""
        n = len(steps)
        events = np.empty((len(self.event), n), dtype=np.uint8)
        events[:] = self.event[:, None]
        events[1:9] = walls.astype("<f8").view(np.uint8).reshape(n, 8).T
        for i in range(self.step_bytes):
            more = 0x80 if i < self.step_bytes - 1 else 0
            events[10 + i] = ((steps >> (7 * i)) & 0x7F) | more
        as_bytes = values.astype("<f4").view(np.uint8).reshape(n, -1, 4)
        for j, at in enumerate(self.value_at):
            events[at:at + 4] = as_bytes[:, j, :].T
        out = np.empty((n, self.length), dtype=np.uint8)
        out[:, :len(self.header)] = self.header
        out[:, len(self.header):-4] = events.T
        out[:, -4:] = masked_crc32c(events, table).astype("<u4").view(np.uint8).reshape(n, 4)
        return out


def _masked(data: bytes) -> int:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as crc

    return int(crc(data))


class EventFiles:
    """A job attempt's event files in ``directory``, written by one thread."""

    def __init__(self, directory: Path, purge_step: int | None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.started = time.time()
        self.table = _crc_table()
        self.layouts: dict[tuple[tuple[str, ...], int], ScalarLayout] = {}
        self.last_wall = self.started
        self.file: Any = None
        self.changed: set[Path] = set()  # written since the last ``take_changed``
        self._new_file(purge_step)

    def _new_file(self, purge_step: int | None = None) -> None:
        """As torch's ``SummaryWriter`` names and starts them; ``purge_step`` makes
        TensorBoard drop what earlier files have from that step on."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        if self.file is not None:
            self.file.close()
        self.path = self.directory / (f"events.out.tfevents.{int(self.started):010d}."
                                      f"{socket.gethostname()}.{os.getpid()}."
                                      f"{next(_file_numbers):06d}")
        self.file = open(self.path, "xb")  # noqa: SIM115 - closed by close()
        now = time.time()
        self._write(frame(Event(wall_time=now, step=purge_step or 0,
                                file_version="brain.Event:2").SerializeToString()))
        if purge_step is not None:
            self._write(frame(Event(wall_time=now, step=purge_step, session_log=SessionLog(
                status=SessionLog.START)).SerializeToString()))

    def _write(self, data: bytes) -> None:
        self.file.write(data)
        self.changed.add(self.path)

    def scalars(self, points: list[StepPoints]) -> None:
        """One event per step (steps ascending), wall times spread from the last batch to now."""
        points = [p for p in points if p.values]
        if not points:
            return
        now = time.time()
        walls = np.linspace(self.last_wall, now, len(points) + 1)[1:]
        self.last_wall = now
        # Steps with the same metrics and step width share a layout (group); usually one group
        # and the steps with an evaluation, each a run of consecutive steps in the file.
        ids: dict[tuple[tuple[str, ...], int], int] = {}
        group_of = np.array([ids.setdefault((tuple(p.values), (p.step.bit_length() + 6) // 7 or 1),
                                            len(ids)) for p in points])
        encoded = []
        for key, group in ids.items():
            if (layout := self.layouts.get(key)) is None:
                layout = self.layouts[key] = ScalarLayout(*key)
            at = np.flatnonzero(group_of == group)
            chosen = points if len(ids) == 1 else [points[i] for i in at]
            steps = np.array([p.step for p in chosen], dtype=np.int64)
            values = np.array([list(p.values.values()) for p in chosen], dtype=np.float64)
            encoded.append(layout.records(walls[at], steps, values, self.table))
        # In step order: each run of one group's steps is a slice of its records.
        row_of = np.zeros(len(points), dtype=np.int64)
        for group in range(len(ids)):
            at = np.flatnonzero(group_of == group)
            row_of[at] = np.arange(len(at))
        starts = [0, *(np.flatnonzero(np.diff(group_of)) + 1).tolist(), len(points)]
        self._write(b"".join(
            encoded[group_of[start]][row_of[start]:row_of[start] + end - start].tobytes()
            for start, end in zip(starts, starts[1:], strict=False)))

    def text(self, tag: str, text: str, step: int) -> None:
        """A text entry (TensorBoard's Text tab), as torch's ``add_text`` writes it."""
        from tensorboard.compat.proto.event_pb2 import Event

        event = Event(wall_time=time.time(), step=step, summary=text_summary(tag, text))
        self._write(frame(event.SerializeToString()))

    def flush(self) -> None:
        """To the file system; the next file is started when this one is full."""
        self.file.flush()
        if self.file.tell() > MAX_FILE_BYTES:
            self._new_file()

    def take_changed(self) -> list[Path]:
        changed, self.changed = sorted(self.changed), set()
        return changed

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def text_summary(tag: str, text: str) -> Any:
    """The ``Summary`` torch's ``torch.utils.tensorboard.summary.text`` builds, from
    tensorboard's own protos: importing torch's module imported torch into the tracker host,
    2-3 s of every run's end on a loaded machine (issue 45)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

    plugin_data = SummaryMetadata.PluginData(plugin_name="text",
                                             content=TextPluginData(version=0).SerializeToString())
    tensor = TensorProto(dtype="DT_STRING", string_val=[text.encode("utf_8")],
                         tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
    return Summary(value=[Summary.Value(tag=tag + "/text_summary",
                                        metadata=SummaryMetadata(plugin_data=plugin_data), tensor=tensor)])
