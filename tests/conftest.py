import glob
import importlib.util
import os
import shutil

from tests.xla_flags import cpu_xla_flags


def _accelerator_platform() -> str | None:
    """The accelerator platform jax can use on this machine (an NVIDIA device node and a CUDA plugin),
    found without initialising jax; None on a machine without one (no probing there)."""
    if glob.glob("/dev/nvidia[0-9]*") and any(importlib.util.find_spec(m) for m in (
            "jax_cuda12_plugin", "jax_cuda13_plugin")):
        return "cuda"
    return None


# Before JAX starts. CPU is the default backend everywhere (8 host devices for the sharding tests; the
# parity tests compare float32 CPU numerics with torch); where an accelerator is present its platform is
# initialised too, not excluded, and the tests marked `gpu` run on it explicitly (`accelerator`
# fixture). A JAX_PLATFORMS set by the caller is kept as given.
ACCELERATOR = _accelerator_platform()
os.environ.setdefault("JAX_PLATFORMS", "cpu" + (f",{ACCELERATOR}" if ACCELERATOR else ""))
# The tiny models' tests are bound by XLA compile time, not run time (a cache hit runs a decode test in a third
# of its time). On a CPU-only machine: LLVM's fast codegen (tests/xla_flags.py), and one persistent
# compilation cache per user, beside the converted models (`$CARRYOVER_CACHE/jax-tests`, default
# ~/.cache/carryover_jax), so a program another test module, worker or earlier run (in any clone or worktree)
# already compiled is loaded, not rebuilt. The cache's key holds the program, the compile options and the jax
# version, so a changed program is compiled anew; past 2 GiB the oldest entries go (`prune_cache` below; jax's own
# size limit re-reads the whole folder on every write, which doubled some files' time).
# CARRYOVER_TEST_CACHE=DIR puts it elsewhere (a fresh DIR: the suite compiles everything, as on a new machine).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8" if ACCELERATOR else cpu_xla_flags(8))
# A JAX_COMPILATION_CACHE_DIR the caller set is used as given and never pruned.
TEST_CACHE = None
if not ACCELERATOR and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    TEST_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ.get("CARRYOVER_TEST_CACHE") or os.path.join(
        os.environ.get("CARRYOVER_CACHE") or os.path.expanduser("~/.cache/carryover_jax"), "jax-tests")
if not ACCELERATOR:
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402
import pytest  # noqa: E402

from tests import schedule  # noqa: E402
from tests.hf_models import tiny_hf_model  # noqa: E402


def _accelerator_devices() -> list:
    """The devices of the first non-CPU platform jax was asked to initialise (none asked: none, and jax's
    backends are not touched, so collection on a CPU machine initialises nothing)."""
    for platform in [p for p in os.environ.get("JAX_PLATFORMS", "").split(",") if p and p != "cpu"]:
        try:
            return jax.devices(platform)
        except Exception:  # noqa: BLE001 - a platform that failed to initialise is no accelerator
            continue
    return []


def pytest_collection_modifyitems(config, items):
    """Files longest first (tests/schedule.py). Tests marked `gpu` need an accelerator: skipped (with the
    reason) where jax has none."""
    schedule.longest_files_first(items)
    gpu_items = [i for i in items if i.get_closest_marker("gpu")]
    if gpu_items and not _accelerator_devices():
        skip = pytest.mark.skip(reason="needs an accelerator: jax has no GPU/TPU device here")
        for item in gpu_items:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    schedule.record(report)


def pytest_sessionfinish(session):
    schedule.write_table()
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        prune_cache(TEST_CACHE)


def prune_cache(folder: str | None, *, limit: int = 2 << 30, keep: int = 1 << 30) -> None:
    """Past `limit` bytes, delete the persistent compilation cache's oldest entries (by mtime) down to `keep`."""
    if not folder or not os.path.isdir(folder):
        return
    sizes = {e.path: e.stat() for e in os.scandir(folder) if e.is_file()}
    total = sum(st.st_size for st in sizes.values())
    if total <= limit:
        return
    for path, st in sorted(sizes.items(), key=lambda kv: kv[1].st_mtime):
        if total <= keep:
            break
        try:
            os.remove(path)
            total -= st.st_size
        except OSError:  # another run removed it first
            pass


@pytest.fixture
def accelerator():
    """The first accelerator device, made the default device for the test (jit runs there; arrays
    created inside are placed there)."""
    devices = _accelerator_devices()
    if not devices:
        pytest.skip("needs an accelerator")
    with jax.default_device(devices[0]):
        yield devices[0]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return tiny_hf_model("llama", tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_llama_worded(tiny_llama, tmp_path_factory):
    """The tiny Llama's folder with a word-level tokenizer (prompts as text, chat templates)."""
    from tests.hf_models import add_word_tokenizer

    folder = tmp_path_factory.mktemp("tiny_llama_worded") / "target"
    shutil.copytree(tiny_llama.path, folder)
    add_word_tokenizer(folder)
    return folder


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


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """The persistent XLA cache a module's training runs share, in process and in the subprocesses that get its
    path (runs that compile the same step re-use it, ~15 s each): the suite's own where it has one (CPU
    machines, above); elsewhere one of the module's own, switched off again afterwards."""
    suite = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if suite:
        yield suite
        return
    from jax.experimental.compilation_cache import compilation_cache as cc

    d = str(tmp_path_factory.mktemp("xla_cache"))
    old = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    jax.config.update("jax_compilation_cache_dir", d)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    cc.reset_cache()
    yield d
    jax.config.update("jax_compilation_cache_dir", old[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])
    cc.reset_cache()
