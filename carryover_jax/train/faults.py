"""Training faults: an unwritable or full output folder, a non-finite loss, and SIGTERM (preemption).

- `prepare_out_dir` / `check_disk_space` run before anything is compiled, so a read-only or full
  `out_dir` fails at once instead of at the first checkpoint.
- `FiniteGuard` watches the loss and gradient norm without a host sync per step: the device scalars
  are fetched only when a checkpoint is about to be saved, at logging steps and at the end, and the
  first non-finite step is reported. A NaN state is therefore never saved; the last good checkpoint
  stays the newest one.
- `StopSignal` turns SIGTERM (what SLURM sends before preemption or at the time limit) into a flag the
  loop checks between steps: it saves a checkpoint of the last finished step and returns cleanly, and
  the resubmitted job resumes from it with the same batches and losses.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from carryover_jax.errors import TrainingError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # SLURM: TERM before a kill; --signal=USR1@T if asked


def prepare_out_dir(out_dir: str | os.PathLike) -> Path:
    """Create `out_dir` and prove it writable (write, fsync and delete a probe file)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrainingError(f"cannot create the output folder {out} ({e.strerror or e})") from None
    probe = out / f".write-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise TrainingError(f"the output folder {out} is not writable ({e.strerror or e})") from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    return out


def tree_bytes(tree: Any) -> int:
    return int(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def check_disk_space(out_dir: str | os.PathLike, state: Any, *, copies: float = 2.0,
                     margin: int = 16 << 20) -> int:
    """Fail now if `out_dir` cannot hold `copies` checkpoints of `state` (one being written while the
    previous one is kept) plus a margin; returns the bytes needed."""
    out = Path(out_dir)
    need = int(copies * tree_bytes(state)) + margin
    free = shutil.disk_usage(out).free
    if free < need:
        raise TrainingError(
            f"the output folder {out} has {free / 2**20:.1f} MiB free; checkpoints of this run need about "
            f"{need / 2**20:.1f} MiB"
        )
    return need


class FiniteGuard:
    """Remembers each step's loss and grad norm (device scalars) and checks them when asked."""

    def __init__(self):
        self._pending: list[tuple[int, Any, Any]] = []
        self.last_good = 0

    def record(self, step: int, metrics: dict) -> None:
        self._pending.append((step, metrics.get("loss"), metrics.get("grad_norm")))

    def check(self, checkpoints: list[int] | None = None) -> None:
        """Raise `TrainingError` naming the first recorded step whose loss or gradient is non-finite
        (and the newest checkpoint, from `checkpoints`, which is older and finite)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        values = jax.device_get([(l, g) for _, l, g in pending])
        for (step, _, _), (loss, gnorm) in zip(pending, values):
            bad = [(n, v) for n, v in (("loss", loss), ("gradient norm", gnorm))
                   if v is not None and not np.all(np.isfinite(np.asarray(v, np.float64)))]
            if bad:
                what = " and ".join(f"{n} {float(np.asarray(v).ravel()[0])}" for n, v in bad)
                ck = f"the last good checkpoint is step {max(checkpoints)}" if checkpoints else "no checkpoint"
                raise TrainingError(
                    f"non-finite {' and '.join(n for n, _ in bad)} at step {step} ({what}); training stopped "
                    f"without saving it ({ck}; last finite step {self.last_good}); lower the lr or check the data"
                )
            self.last_good = step


class StopSignal:
    """Context manager: SIGTERM/SIGUSR1 set a flag (instead of killing) while training runs."""

    def __init__(self, signals=STOP_SIGNALS):
        self.signals = signals
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def _handler(self, signum, frame):
        if self.received is None:
            print(f"received {signal.Signals(signum).name}: saving a checkpoint after this step, then stopping",
                  file=sys.stderr, flush=True)
        self.received = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # signal handlers: main thread only
            for s in self.signals:
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()
        return False

    def requested(self) -> bool:
        """Whether to stop now; with several processes, all of them agree (any one signalled stops all)."""
        flag = self.received is not None
        if jax.process_count() > 1:
            flag = bool(np.any(multihost_utils.process_allgather(np.int32(flag))))
        return flag

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else "a stop request"


def save_before_stop(ckpt, guard: FiniteGuard, step: int, state: Any, data_iter) -> None:
    """Checkpoint the last finished `step` (after checking it is finite) unless it is saved already."""
    guard.check(ckpt.steps())
    if step > 0 and step not in ckpt.steps():
        ckpt.save(step, state, data_iter, force=True)
    ckpt.wait()


def metrics_lines_upto(path: Path, step: int) -> list[str]:
    """The lines of a run's metrics.jsonl up to `step` (the checkpoint a run resumes from). A line a killed
    run left half-written (or any other unparsable line) is dropped with a one-line notice, not a traceback."""
    keep, bad = [], 0
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            s = int(rec["step"])
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        if s <= step:
            keep.append(line)
    if bad:
        print(f"train: dropped {bad} unreadable line(s) of {path} (a killed write)", file=sys.stderr)
    return keep
