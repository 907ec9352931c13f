"""Two processes on localhost (CPU collectives) produce the same step as one process.

Two `train()` processes of 2 CPU devices each (`jax.distributed` through CARRYOVER_*, gloo collectives)
and one process of 4 CPU devices train the same drafter for 2 steps with the same global batch size;
the exported drafters and the logged losses must agree to float32 reduction noise.

Why the global batches are identical: every host draws the same shuffled permutation of the store
(same seed, same record count — `multiple_of=process_count` trims it equally) and host p takes the
contiguous rows p·b .. p·b+b-1 of each global batch (`pipeline.HostBlocks`), so the assembled global
array equals the single process's batch row for row, and so do the per-row anchor draws. The test uses
fewer anchors than candidate positions, so a row-order mismatch would show up as a loss difference.

Adam's eps is raised to 1e-4 for the comparison: with the default 1e-8, a parameter whose gradient is
near 0 gets an update of about ±lr whose size hangs on the last bits of that gradient, so the summation
order of a different device layout moved single elements by ~1e-5 (seen: one of 4096 by 1.4e-5 in one
matrix, every other element within 2e-6). With eps=1e-4 such updates are linear in the gradient.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from carryover_jax.config import DataConfig
from carryover_jax.train.pipeline import make_train_iter
from carryover_jax.train.store import ResponseStore
from tests.synthetic import synthetic_store
from tests.xla_flags import cpu_xla_flags

WORKER = Path(__file__).with_name("multihost_worker.py")
REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240  # all processes of one run together
MAX_LEN, BATCH, STEPS = 32, 8, 2


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return synthetic_store(tmp_path_factory.mktemp("mh_store") / "responses")


def test_host_shards_make_up_the_single_process_batches(store):
    """The data half of the claim, checked directly: per step, host 0's rows followed by host 1's are
    the single-process batch, row for row."""
    st = ResponseStore.open(store)
    cfg = DataConfig(store=str(store), max_len=MAX_LEN, min_loss_tokens=2)
    one = make_train_iter(cfg, st, batch_size=BATCH, seed=42, read_threads=1)
    hosts = [make_train_iter(cfg, st, batch_size=BATCH // 2, seed=42, process_index=p, process_count=2,
                             read_threads=1) for p in range(2)]
    for _ in range(4):  # past the first epoch boundary (24 records = 3 batches)
        ref = next(one)["input_ids"]
        glob = np.concatenate([next(h)["input_ids"] for h in hosts])
        assert sorted(map(tuple, ref.tolist())) == sorted(map(tuple, glob.tolist()))
        np.testing.assert_array_equal(glob, ref)  # same rows, same order


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int, rank: int | None, nproc: int, port: int) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CARRYOVER_", "SLURM_", "OMPI_", "PMI_"))}  # no stray cluster detection
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=cpu_xla_flags(devices),
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    if rank is not None:
        env.update(CARRYOVER_COORDINATOR=f"localhost:{port}", CARRYOVER_NUM_PROCESSES=str(nproc),
                   CARRYOVER_PROCESS_ID=str(rank))
    return env


def _launch(spec: dict, tmp: Path, name: str, env: dict) -> tuple[subprocess.Popen, Path]:
    spec_path = tmp / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    log = tmp / f"{name}.log"
    with log.open("w") as f:
        # a session of its own: the whole process group can be killed, leaving no orphans behind
        p = subprocess.Popen([sys.executable, str(WORKER), str(spec_path)], cwd=REPO, env=env, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
    return p, log


def _kill(p: subprocess.Popen):
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait(timeout=30)


def _wait_all(procs: list[tuple[subprocess.Popen, Path]], timeout: float):
    """Wait for every process; the first failure (or the deadline) kills the rest at once — a peer
    of a dead process would otherwise block in a collective until the coordinator's heartbeat timeout."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = [p.poll() for p, _ in procs]
            bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if bad or all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s\n" + _tails(procs))
            time.sleep(0.2)
        if bad:
            raise AssertionError(f"process(es) {bad} failed\n" + _tails(procs))
    finally:
        for p, _ in procs:
            _kill(p)


def _tails(procs) -> str:
    return "\n".join(f"--- {log.name} (rc {p.poll()}) ---\n{log.read_text()[-3000:]}" for p, log in procs)


def _drafter(out: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(out / "drafter" / "model.safetensors")


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def test_two_processes_match_one_process(tiny_llama, store, tmp_path):
    spec = dict(target=str(tiny_llama.path), store=str(store), max_len=MAX_LEN, batch_size=BATCH,
                num_anchors=6, steps=STEPS, eps=1e-4)
    port = _free_port()
    multi = tmp_path / "multi"
    single = tmp_path / "single"
    procs = [_launch(dict(spec, out_dir=str(multi)), tmp_path, f"rank{i}", _env(2, i, 2, port)) for i in range(2)]
    # the one-process reference (4 devices = the same global mesh) runs alongside the pair
    procs.append(_launch(dict(spec, out_dir=str(single)), tmp_path, "single", _env(4, None, 1, port)))
    _wait_all(procs, TIMEOUT_S)

    summaries = [json.loads((multi / f"summary-{i}.json").read_text()) for i in range(2)]
    for i, s in enumerate(summaries):
        assert s["finished"] and s["steps"] == STEPS
        assert (s["process_index"], s["process_count"], s["global_devices"], s["local_devices"]) == (i, 2, 4, 2)
    ref = json.loads((single / "summary-0.json").read_text())
    assert (ref["process_count"], ref["global_devices"]) == (1, 4)
    assert "drafter" in summaries[0] and "drafter" not in summaries[1]  # only the main process exports

    got, want = _losses(multi), _losses(single)
    assert sorted(got) == sorted(want) == [1, 2]
    assert want[1] != want[2]  # the first step did change the drafter
    for s in want:
        assert got[s] == pytest.approx(want[s], rel=1e-5, abs=1e-6), s

    a, b = _drafter(multi), _drafter(single)
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)  # seen: <1e-7


def test_a_tpu_slice_worker_initializes_from_the_tpu_metadata(monkeypatch):
    """launch/train_tpu_slice.sh's CARRYOVER_TPU_SLICE=1: `jax.distributed.initialize()` with no arguments
    (on a TPU VM jax reads the coordinator and the worker's rank from the VM's metadata); the script itself
    refuses, in one line, a venv without the carryover command."""
    import jax

    from carryover_jax.train import distributed

    calls = []
    monkeypatch.setattr(distributed, "_initialized", False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **kw: calls.append((a, kw)))
    for name in ("CARRYOVER_COORDINATOR", "SLURM_NTASKS", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    assert not distributed.maybe_initialize() and calls == []
    monkeypatch.setenv("CARRYOVER_TPU_SLICE", "1")
    assert distributed.maybe_initialize() and calls == [((), {})]
    p = subprocess.run(["bash", "launch/train_tpu_slice.sh", "qwen3_4b_tpu"], cwd=Path(__file__).resolve().parents[1],
                       env=dict(os.environ, CARRYOVER_VENV="/nonexistent"), capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "pip install -e '.[tpu]'" in p.stderr
