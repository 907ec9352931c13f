"""`key=value` overrides on the nested frozen config dataclasses (the CLI's `--set`), typed by the fields'
annotations."""

from __future__ import annotations

import ast
import dataclasses
import functools
import types
import typing
from typing import Any

from carryover_jax.config.train import MOVED_TO_LOSS, TrainConfig
from carryover_jax.errors import ConfigError
from carryover_jax.paths import resolve_config_paths


def apply_overrides(cfg, overrides: list[str]):
    """`key=value` overrides on nested frozen dataclasses (`data.max_len=512`, `drafter.kind=markov`);
    values parse as Python literals when they can, else stay strings. Every command loads its config
    through here, so a TrainConfig also gets its user paths made absolute here, once
    (`paths.resolve_config_paths`)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value")
        key, raw = item.split("=", 1)
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        cfg = _set_path(cfg, key.split("."), value, key)
    return resolve_config_paths(cfg) if isinstance(cfg, TrainConfig) else cfg


_BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_TYPE_NAMES = {bool: "a bool", int: "an int", float: "a float", str: "a str", tuple: "a tuple"}


@functools.lru_cache(maxsize=None)
def _field_types(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value, annotation, full):
    """`value` as the field's annotated type: `false`/`no`/`off` are a bool, `3` for a float field is 3.0,
    `123` for a str field is "123", `5` for a tuple field is (5,), `None` only where the annotation
    admits it; anything else is one error instead of a silently truthy string or a None that fails
    later. (The dataclass's __post_init__ then checks the value's range.)"""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
        else (annotation,)
    optional = type(None) in options
    kinds = [typing.get_origin(o) or o for o in options if o is not type(None)]
    kind = kinds[0] if len(kinds) == 1 else None
    if value is None:
        if optional:
            return None
    elif kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
        if value in (0, 1) and isinstance(value, int):
            return bool(value)
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif kind is tuple:
        item = (typing.get_args(next(o for o in options if o is not type(None))) or (Any,))[0]
        items = value if isinstance(value, tuple) else (value,) if isinstance(value, (int, str)) else None
        if items is not None:
            try:
                return tuple(i if item is Any else _coerce(i, item, f"{full}[{n}]") for n, i in enumerate(items))
            except ConfigError:
                pass
    elif kind is not None and dataclasses.is_dataclass(kind):
        raise ConfigError(f"{full} is a {kind.__name__}: set its fields ({full}.NAME=VALUE), got {value!r}")
    else:  # an annotation this parser does not know: keep the value (the dataclass checks it)
        return value
    what = _TYPE_NAMES.get(kind, f"a {getattr(kind, '__name__', kind)}")
    if kind is tuple:
        item = typing.get_args(next(o for o in options if o is not type(None)))[:1]
        what = f"a tuple of {item[0].__name__}" if item and item[0] is not Any else what
    raise ConfigError(f"{full} expects {what}{' or None' if optional else ''}, got {value!r}")


def _set_path(obj, path, value, full):
    name = path[0]
    if not dataclasses.is_dataclass(obj) or name not in {f.name for f in dataclasses.fields(obj)}:
        if isinstance(obj, TrainConfig) and name in MOVED_TO_LOSS:
            raise ConfigError(f"config key {full!r} is now loss.{MOVED_TO_LOSS[name]}")
        raise ConfigError(f"unknown config key {full!r}")
    if len(path) == 1:
        if isinstance(value, list):  # config sequences are tuples (hashable, jit-static)
            value = tuple(value)
        return dataclasses.replace(obj, **{name: _coerce(value, _field_types(type(obj))[name], full)})
    return dataclasses.replace(obj, **{name: _set_path(getattr(obj, name), path[1:], value, full)})
