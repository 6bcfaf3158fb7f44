"""What the submit-time limits cost (issue 15, item 3): `limit_errors` (the service maxima and
the torch-free memory floor, services/spec/limits.py) against the spec validation a submit
already does, per spec, interleaved and repeated. Prints one JSON object.

    .venv/bin/python -m bench.service.spec_limits [--repeats 7] [--quick] [--out [DIR]]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.harness import common as _common
from services.spec import parse_spec
from services.spec.limits import SpecLimits, limit_errors

BASE = {"micro_batch_size": 16, "accumulation_steps": 4, "epochs": 1,
        "optimizer": {"name": "sgd", "lr": 0.1}}
SPECS: dict[str, dict[str, Any]] = {
    "mlp-digits": {**BASE, "model": "mlp", "dataset": "digits"},
    "resnet50-fake": {**BASE, "model": "resnet50", "dataset": {"name": "fake", "image_size": 224}},
    "tiny_transformer-text": {**BASE, "model": "tiny_transformer", "dataset": "text"},
}


def per_call_us(fn: Any, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true")
    _common.add_out_argument(parser)
    args = parser.parse_args()
    calls = 50 if args.quick else 2000
    limits = SpecLimits()
    rows = {}
    for name, raw in SPECS.items():
        spec = parse_spec(raw)
        parse_us, limits_us = [], []
        for _ in range(args.repeats):  # interleaved: a burst of load hits both sides
            parse_us.append(per_call_us(lambda raw=raw: parse_spec(raw), calls))
            limits_us.append(per_call_us(lambda spec=spec: limit_errors(spec, limits), calls))
        rows[name] = {
            "parse_spec_us": round(statistics.median(parse_us), 1),
            "limit_errors_us": round(statistics.median(limits_us), 1),
            "ratio_limits_to_parse": round(
                statistics.median(b / a for a, b in zip(parse_us, limits_us, strict=True)), 3
            ),
        }
    _common.emit("spec_limits", {
        "machine": _common.machine(),
        "repeats": args.repeats, "calls_per_repeat": calls, "specs": rows,
    }, args)


if __name__ == "__main__":
    main()
