"""What ``torch.compile`` did to a run, said as the trainer's events once the first optimizer
step has run (compilation happens lazily, at the first forward and backward):

    trainer = Trainer(model, optimizer, callbacks=[CompileWatch()])   # model.compile()d
    # history.events: {"kind": "compiled", "data": {"compile_s": 31.8, "graphs": 1}, ...}
    #              or {"kind": "compile_fallback", "data": {"reason": "InductorError: ..."}}

``fast_path.maybe_compile`` turns on dynamo's ``suppress_errors``: a frame that fails to
compile (a broken C++ toolchain, an operator inductor cannot lower) runs eagerly instead of
failing the job. The window's arithmetic is the trainer's either way, so exactness holds in
both cases; the fallback only costs the speed-up, and the event says why.
"""

from __future__ import annotations

import logging
from typing import Any

from accumcore.callbacks import Callback

DYNAMO_LOGGER = "torch._dynamo"


class _Warnings(logging.Handler):
    """The last error line of dynamo's warnings (a suppressed compile error's reason)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reason: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        lines = [line.strip() for line in record.getMessage().splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line.split(":", 1)[0]]
        if errors:
            self.reason = errors[-1][:500]


def _compile_state() -> tuple[float, int, int]:
    """Seconds dynamo spent compiling so far, frames compiled, frames it gave up on."""
    from torch._dynamo import utils

    spent = utils.calculate_time_spent().get("total_wall_time", 0.0)
    frames = utils.counters["frames"]
    return float(spent), int(frames.get("ok", 0)), int(frames.get("total", 0)) - int(frames.get("ok", 0))


class CompileWatch(Callback):
    """Emits ``compiled`` (seconds spent compiling, graphs made) or ``compile_fallback`` (the
    reason; the run goes on eagerly) after the first optimizer step of ``fit``."""

    def __init__(self) -> None:
        self._warnings = _Warnings()
        self._before: tuple[float, int, int] | None = None

    def on_fit_start(self, trainer: Any) -> None:
        self._before = _compile_state()
        logging.getLogger(DYNAMO_LOGGER).addHandler(self._warnings)

    def on_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        if self._before is None:
            return
        spent, ok, failed = (now - before for now, before in zip(_compile_state(), self._before, strict=True))
        self._before = None
        logging.getLogger(DYNAMO_LOGGER).removeHandler(self._warnings)
        if ok > 0 and failed == 0:
            trainer.emit("compiled", f"torch.compile compiled the model's forward and backward in "
                          f"{spent:.1f} s (during the first optimizer step)",
                          {"compile_s": round(spent, 3), "graphs": int(ok)})
            return
        reason = self._warnings.reason or ("nothing was compiled" if ok == 0 else f"{failed} frame(s) failed")
        trainer.emit("compile_fallback", f"torch.compile failed ({reason}); the model runs eagerly "
                      "(same arithmetic, without the compiled speed-up); set compile: false to skip "
                      "the attempt", {"reason": reason, "compiled_frames": int(ok), "failed_frames": int(failed)})

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        logging.getLogger(DYNAMO_LOGGER).removeHandler(self._warnings)
