"""`launch/device_check.sh --dry-run`: every part of the prepared device check at toy scale on this CPU,
with grain and gguf unimportable as on the device image. Slow: ~2-3 min on 2 cores (the interpreted
kernels at head dims 128-512 with gradients, two training steps, two memory compiles)."""

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dry_run(out: Path, *flags: str):
    env = dict(os.environ, OUT=str(out))
    env.pop("XLA_FLAGS", None)  # the device has one GPU: one device here too
    p = subprocess.run(["bash", "launch/device_check.sh", "--dry-run", *flags], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "device-check.json").read_text())
    assert res["dry_run"] and res["errors"] == {}, res["errors"]
    return p, res


@pytest.mark.heavy  # minutes here: outside the CI budget (CARRYOVER_TEST_HEAVY=1)
@pytest.mark.slow
def test_device_check_dry_run_end_to_end(tmp_path):
    out = tmp_path / "out"
    p, res = _dry_run(out)
    # kernels: every backend at every head dim equals einsum (interpreted here) on values and gradients
    dims = {(c["backend"], c["head_dim"]) for c in res["kernel_check"]}
    assert {("pallas", 128), ("pallas", 256), ("pallas", 512), ("auto", 512), ("cudnn", 128)} <= dims
    for c in res["kernel_check"]:
        assert "error" not in c and max(c["train_out_rel"], c["train_grad_rel"], c["decode_out_rel"]) < 1e-4, c
    st = res["steps"]
    assert [b["backend"] for b in st["backends"]] == ["auto", "einsum"]
    auto = st["backends"][0]
    assert "error" not in auto and auto["ar_over_weight_floor"] > 0 and auto["break_even_tau"] > 0
    for mode in ("baseline", "dvd"):
        t = auto[f"train_{mode}"]
        assert "error" not in t and t["train_step_ms"] > 0 and 0 < t["mfu"] < 1 and t["tflop"]["total"] > 0
    assert "verify" in auto["train_dvd"]["tflop"] and "verify" not in auto["train_baseline"]["tflop"]
    assert [(r["config"], r["mode"]) for r in res["memory"]] == [("qwen3_4b", "baseline"), ("gemma4_12b", "baseline"),
                                                                 ("qwen3_4b", "dvd")]
    assert all(r["total_gb"] > 0 and "compiled" in r["method"] for r in res["memory"])
    with tarfile.open(out / "trace-round.tar.gz") as tar:
        assert any(n.endswith(".xplane.pb") for n in tar.getnames())
    assert res["tests"]["rc"] == 0 and "collected" in res["tests"]["summary"]  # dry run: collection only
    assert res["gpu_tests"]["rc"] in (0, 5) and "skipped" in res["gpu_tests"]["summary"]  # no GPU here
    files = sorted(f.name for f in out.iterdir())
    assert len(files) <= 8 and {"device-check.json", "device-check.md", "trace-round.tar.gz", "tests.txt"} <= set(files)
    assert "## bench steps" in (out / "device-check.md").read_text()
    assert "carry set: " in p.stdout and "within the 64 MiB of one call: True" in p.stdout


@pytest.mark.heavy
@pytest.mark.slow
def test_device_check_dry_run_of_a_tpu_vm(tmp_path):
    """`--dry-run --tpu`: the parts a TPU VM runs — the Mosaic kernel (interpreted here) and auto against
    einsum, bench steps, the TPU program's memory rows, and tests/test_tpu_lowering.py (skipped here
    without libtpu) in place of the GPU tests."""
    _, res = _dry_run(tmp_path / "out", "--tpu")
    assert res["command"] == "bash launch/device_check.sh --dry-run --tpu"
    assert {(c["backend"], c["head_dim"]) for c in res["kernel_check"]} == {
        (b, d) for b in ("mosaic", "auto") for d in (128, 256, 512)}
    assert all("error" not in c and c["decode_out_rel"] < 1e-4 for c in res["kernel_check"])
    assert "error" not in res["steps"]["backends"][0]
    assert all(r["total_gb"] > 0 for r in res["memory"])
    assert "gpu_tests" not in res and res["tpu_tests"]["rc"] == 0 and "tests/test_tpu_lowering.py" in \
        res["tpu_tests"]["command"]
