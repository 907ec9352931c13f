"""Paths a user gives, made absolute once at the boundary: CLI options (argparse `type=`) and loaded
configs (`resolve_config_paths`, applied by `config.apply_overrides`).

Libraries further down then never see `..`, `~` or a path relative to a working directory that a
later stage changes (tensorstore refuses a `..` component outright). Paths are made absolute
lexically (`os.path.abspath`, like the shell's `$PWD`), so a printed path is the one typed, minus `..`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

# suffixes of files an alias-or-path option names (a target .gguf, a prompt JSONL, ...)
_FILE_SUFFIXES = (".gguf", ".jsonl", ".json", ".py")


def cache_dir() -> Path:
    """Where converted weights, compiled programs and built CPU kernels live: `$CARRYOVER_CACHE`, default
    ~/.cache/carryover_jax."""
    return Path(os.environ.get("CARRYOVER_CACHE", Path.home() / ".cache" / "carryover_jax"))


def user_path(p: str | os.PathLike) -> str:
    """`p` absolute, `~` expanded, `.`/`..` removed."""
    return os.path.abspath(os.path.expanduser(os.fspath(p)))


def looks_like_path(s: str) -> bool:
    """Whether a value that may be a name (a target alias, `sharegpt`, a config name) or a path is a
    path: it has a separator, starts with `~` or `.`, or ends with a file suffix. A bare name stays
    a name, so an alias is never shadowed by a same-named folder in the working directory."""
    return os.sep in s or "/" in s or s.startswith(("~", ".")) or s.endswith(_FILE_SUFFIXES)


def name_or_path(s: str) -> str:
    return user_path(s) if looks_like_path(s) else s


def resolve_config_paths(cfg):
    """A TrainConfig with every path field absolute: target / data.source when they are paths (not an
    alias / `sharegpt`), init_from, out_dir, data.store and data.extra_stores."""
    data = dataclasses.replace(cfg.data, store=user_path(cfg.data.store), source=name_or_path(cfg.data.source),
                               extra_stores=tuple(user_path(p) for p in cfg.data.extra_stores))
    return cfg.replace(target=name_or_path(cfg.target), out_dir=user_path(cfg.out_dir), data=data,
                       init_from=None if cfg.init_from is None else user_path(cfg.init_from))
