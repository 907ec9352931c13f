"""A non-editable install ships the run configs, the PyTorch reference and the CPU kernel's C++ source inside
carryover_jax, and installs nothing else at the top level of site-packages."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# source folder -> where its modules must land in the installed package
SHIPPED = {"carryover_jax": "carryover_jax", "configs": "carryover_jax/configs", "export": "carryover_jax/export"}


def test_non_editable_install_ships_configs_and_export_inside_the_package(tmp_path):
    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info next to the sources
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    for d in SHIPPED:
        shutil.copytree(REPO / d, src / d, ignore=shutil.ignore_patterns("__pycache__"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(site), str(src)], check=True)

    top = {p.name for p in site.iterdir()} - {"bin"}
    assert top and all(n == "carryover_jax" or n.startswith("carryover_jax-") for n in top), top
    for d, dest in SHIPPED.items():  # every source module is in the wheel, at its package path
        for f in [*(REPO / d).rglob("*.py"), *(REPO / d).rglob("*.cc"), *(REPO / d).rglob("*.h")]:
            assert (site / dest / f.relative_to(REPO / d)).is_file(), f"{f.relative_to(REPO)} not installed"

    # the venv's editable finder would resolve a missing module from the repo: check where each came from
    probe = ("import carryover_jax.configs as c, carryover_jax.export.torch_reference as t\n"
             "print(c.__file__); print(t.__file__)\n"
             "cfg = c.load_config('smollm2'); print(cfg.name, cfg.target, c.load_config('smollm2:dvd').loss.mode)\n"
             # the CLI finds the config by name (and then refuses the made-up key)
             "from carryover_jax.cli import main\n"
             "print(main(['train', '--config', 'smollm2', '--set', 'no_such_key=1']))\n")
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)},
                         capture_output=True, text=True, check=True)
    out = run.stdout.split("\n")
    assert out[0] == str(site / "carryover_jax/configs/__init__.py")
    assert out[1] == str(site / "carryover_jax/export/torch_reference.py")
    assert out[2] == "smollm2 smollm2 dvd"
    assert out[3] == "2" and run.stderr.strip().splitlines()[-1] == "carryover train: error: unknown config key 'no_such_key'"
