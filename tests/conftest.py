import os

# Before JAX starts: 8 CPU devices for sharding tests, and no GPU probing in CI.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402

jax.config.update("jax_platforms", "cpu")

import pytest  # noqa: E402

from tests.hf_models import tiny_hf_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return tiny_hf_model("llama", tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    return tiny_hf_model("qwen3", tmp_path_factory.mktemp("tiny_qwen3"))


@pytest.fixture(scope="session", params=["llama", "qwen3"])
def tiny_model(request, tiny_llama, tiny_qwen3):
    return {"llama": tiny_llama, "qwen3": tiny_qwen3}[request.param]


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop jax's compiled executables after each test module: the whole suite in one process
    otherwise keeps hundreds of programs for 8 host devices alive, and XLA's CPU compiler crashed
    (SIGSEGV while compiling the sharded train step) late in such a run."""
    yield
    jax.clear_caches()
