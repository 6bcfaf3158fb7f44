"""Reads the history back from a W&B run file (``run-<id>.wandb``), as ``wandb sync`` would
upload it: the worker finds the last step an offline run holds, tests check every point.

The file is W&B's header (``:W&B``, magic, version: 7 bytes) and then a LevelDB log: 32 KiB
blocks of chunks (crc32c, length, type: full, first, middle, last), each record a
``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    """The file's protobuf records, in order; a torn last record (a killed writer) is left out."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file (no ':W&B' header)")
    pos, pending = HEADER, b""
    while pos + 7 <= len(data):
        if (left := BLOCK - pos % BLOCK) < 7:
            pos += left  # a block's tail too short for a chunk header is padding
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 or len(chunk) < length:
            break
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(pending)
            yield record


def history(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(step, {metric: value})`` of each ``log`` in the run file (W&B's own keys, ``_step``,
    ``_runtime``, ``_timestamp``, left out)."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        values = {}
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            if not key.startswith("_"):
                values[key] = json.loads(item.value_json)
        rows.append((record.history.step.num, values))
    return rows


def last_step(run_files: list[Path]) -> int:
    """The last step any of these run files logged (-1: none)."""
    return max((step for path in run_files for step, _ in history(path)), default=-1)
