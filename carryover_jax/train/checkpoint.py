"""Orbax checkpoints of the training state together with the grain iterator state.

Saves are atomic (orbax finalises a step directory only when complete) and optionally async. On
resume the newest step is restored; if it is unreadable (a killed save, a corrupted file) the error
is reported in one line and the next older step is tried, so a run never silently restarts from
scratch and never loses more than one checkpoint interval.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp

from carryover_jax.errors import CheckpointError, first_line


class Checkpointer:
    def __init__(self, directory: str | Path, *, save_every: int, keep: int, async_save: bool = True):
        self.directory = Path(directory).absolute()
        if self.directory.exists() and not self.directory.is_dir():
            raise CheckpointError(f"checkpoint folder {self.directory} is a file")
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=save_every, max_to_keep=keep, enable_async_checkpointing=async_save, create=True,
        )
        try:
            self.manager = ocp.CheckpointManager(self.directory, options=options)
        except Exception as e:  # unreadable folder, foreign contents
            raise CheckpointError(f"cannot open checkpoint folder {self.directory} ({first_line(e)})") from None

    def save(self, step: int, state: Any, data_iter=None, *, force: bool = False) -> bool:
        items = {"state": ocp.args.StandardSave(state)}
        if data_iter is not None:
            items["data"] = grain.checkpoint.CheckpointSave(data_iter)
        return self.manager.save(step, args=ocp.args.Composite(**items), force=force)

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def restore(self, abstract_state: Any, data_iter=None, *, log=None) -> tuple[Any, int] | None:
        """Newest readable checkpoint -> (state, step), or None when there is none. `abstract_state`
        holds ShapeDtypeStructs with the target shardings (orbax reshards on load)."""
        log = log or (lambda m: print(m, file=sys.stderr))
        failures = []
        for step in reversed(self.steps()):
            items = {"state": ocp.args.StandardRestore(abstract_state)}
            if data_iter is not None:
                items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
            try:
                out = self.manager.restore(step, args=ocp.args.Composite(**items))
            except Exception as e:  # orbax raises many types for truncated/corrupt files
                log(f"checkpoint step {step} in {self.directory} is unreadable ({first_line(e)}); trying an older one")
                failures.append(step)
                continue
            return out["state"], step
        if failures:
            raise CheckpointError(
                f"no readable checkpoint in {self.directory} (steps {failures} are corrupt, or were saved by a run "
                "with another drafter/optimizer config: use a new out_dir or delete them)"
            )
        return None

    def wait(self):
        self.manager.wait_until_finished()

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()


def abstract_like(state: Any, shardings: Any) -> Any:
    return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)
