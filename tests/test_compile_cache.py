"""The CLI's persistent compilation cache: where it goes, what turns it off, and that jax reads it."""

import os
import subprocess
import sys
from pathlib import Path

from carryover_jax import cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_cli_sets_its_compile_cache_under_carryover_cache(monkeypatch, tmp_path):
    for var in ("JAX_COMPILATION_CACHE_DIR", "CARRYOVER_COMPILE_CACHE", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                "JAX_COMPILATION_CACHE_MAX_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CARRYOVER_CACHE", str(tmp_path))
    cli._compile_cache()
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "jax-programs")
    assert os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] == str(2 << 30)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/somewhere/else")  # the caller's choice is kept
    cli._compile_cache()
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == "/somewhere/else"
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("CARRYOVER_COMPILE_CACHE", "0")  # off
    cli._compile_cache()
    assert "JAX_COMPILATION_CACHE_DIR" not in os.environ


def test_a_fresh_process_compiles_into_the_cache(tmp_path):
    """In a new process (jax not yet imported, as under the `carryover` command) jax takes the folder, and a
    program that compiles for over the threshold is written there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION", "JAX_PERSISTENT"))}
    env.update(CARRYOVER_CACHE=str(tmp_path), PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    code = ("from carryover_jax import cli; cli._compile_cache(); import jax, jax.numpy as jnp; "
            "print(jax.config.jax_compilation_cache_dir); jax.jit(lambda x: jnp.sin(x) @ x)(jnp.ones((8, 8)))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path / "jax-programs")
    assert any((tmp_path / "jax-programs").iterdir())
