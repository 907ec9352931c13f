"""The docs check: README.md and every page under docs/ link only to what exists, every `carryover …` command they
quote parses with the CLI's own parser (a dry parse: nothing runs), and every `--set KEY=VALUE` names a real config
key (and, in a whole training command, holds a value that config accepts)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# `--set KEY=VALUE` anywhere (prose, tables, code); --continue-set overrides the same TrainConfig fields
SET = re.compile(r"--(set|continue-set|eval-set)[ =]([A-Za-z_][\w.]*)=")
SHELL_STOP = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "2>&1", "&"}
ALTERNATIVES = re.compile(r"^[\w.-]+(\|[\w.-]+)+$")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def _prose(text: str) -> str:
    """The text outside fenced code blocks (links and inline code live there)."""
    return FENCE.sub("", text)


@functools.lru_cache(maxsize=None)
def _anchors(path: Path) -> frozenset[str]:
    """GitHub's heading ids of a Markdown file: lower case, punctuation but `-` and `_` dropped, spaces to '-',
    repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(_text(path)).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        title = re.sub(r"[`*]", "", m.group(1))
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def _links(path: Path):
    for target in LINK.findall(_prose(_text(path))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: -- not ours to check
            continue
        yield target


def test_every_relative_link_resolves():
    bad = []
    for page in PAGES:
        for target in _links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                bad.append(f"{_rel(page)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{_rel(page)}: {target} (no heading #{anchor} in {_rel(dest)})")
    assert not bad, "broken links:\n" + "\n".join(bad)


def _code_lines(text: str):
    """(line, whole): the shell lines of the fenced blocks (continuations joined), whole commands; then every inline
    code span, which may be a fragment naming a command and some of its options (`carryover eval --curve RUN`)."""
    for block in FENCE.finditer(text):
        for line in block.group(2).replace("\\\n", " ").splitlines():
            yield line, True
    for span in INLINE.findall(_prose(text)):
        yield span, False


def _command(line: str) -> list[str] | None:
    """The argv after `carryover` of a quoted command line, or None if the line runs no `carryover` command.
    Leading VAR=value assignments and a venv prefix (`.venv/bin/carryover`) are skipped; the command ends at a
    shell operator or a comment; optional groups `[...]` are left out (their placeholders are not values)."""
    line = re.sub(r"\[[^\[\]]*\]", " ", line)  # `[--top-k K]`: optional, placeholders inside
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
        words = words[1:]
    if not words or Path(words[0]).name != "carryover" or len(words) < 2 or words[1].endswith(":"):
        return None  # (`carryover train: error: ...` is what the CLI prints, not a command)
    argv = []
    for w in words[1:]:
        if w in SHELL_STOP or w.startswith((">", "2>")):
            break
        argv.append(re.sub(r"^\$\{?\w+\}?$", "1", w))  # a shell variable ($I, $N) stands for a value
    return argv


def _expand(argv: list[str]) -> list[list[str]]:
    """One argv per alternative of a `a|b|c` word (a table's `zlab\\|deepspec`, `bench ar|decode|train`)."""
    out = [[]]
    for w in argv:
        options = w.split("|") if ALTERNATIVES.match(w) else [w]
        out = [a + [o] for a in out for o in options]
    return out


def _quoted_commands():
    for page in PAGES:
        for line, whole in _code_lines(_text(page)):
            if "carryover" not in line:
                continue
            argv = _command(line)
            if argv is not None:
                for variant in _expand(argv):
                    yield page, line.strip(), variant, whole


def _parsers():
    """The CLI's parser, and the same with no option required (for the fragments inline code quotes)."""
    from carryover_jax.cli import build_parser

    lenient = build_parser()
    for action in lenient._subparsers._group_actions[0].choices.values():
        for a in action._actions:
            a.required = False
    return build_parser(), lenient


def test_every_quoted_command_parses(capsys):
    strict, lenient = _parsers()
    bad, n = [], 0
    for page, line, argv, whole in _quoted_commands():
        n += 1
        try:
            (strict if whole else lenient).parse_args(argv)
        except SystemExit:
            err = capsys.readouterr().err.strip().splitlines()
            bad.append(f"{_rel(page)}: `{line}` -> {err[-1] if err else 'exit'}")
    assert n > 40, f"only {n} commands found: the extraction is broken"
    assert not bad, "commands the CLI refuses:\n" + "\n".join(bad)


def _dataclass_types(annotation):
    import typing

    options = typing.get_args(annotation) or (annotation,)
    return [o for o in options if dataclasses.is_dataclass(o)]


def test_every_set_names_a_real_config_key():
    import typing

    from carryover_jax.config.train import TrainConfig
    from carryover_jax.eval.run import evaluate

    hints = {}

    def keys(cls, prefix=""):
        out = set()
        for name, kind in typing.get_type_hints(cls).items():
            if name not in {f.name for f in dataclasses.fields(cls)}:
                continue
            out.add(prefix + name)
            for sub in _dataclass_types(kind):
                out |= keys(sub, prefix + name + ".")
        return out

    hints["set"] = hints["continue-set"] = keys(TrainConfig)
    hints["eval-set"] = set(inspect.signature(evaluate).parameters)
    bad, n = [], 0
    for page in PAGES:
        for flag, key in SET.findall(_text(page)):
            if key.isupper():  # a placeholder (`--set KEY=VALUE`), not a key
                continue
            n += 1
            if key not in hints[flag]:
                bad.append(f"{_rel(page)}: --{flag} {key}=")
    assert n > 20, f"only {n} --set found: the extraction is broken"
    assert not bad, "unknown config keys:\n" + "\n".join(bad)


def test_every_training_command_s_overrides_apply_to_its_config():
    """In a whole `prepare` / `train` / `pipeline` / `bench train` command the values must suit the config too
    (type and range: what `--set` itself checks before anything runs)."""
    from carryover_jax.config import apply_overrides
    from carryover_jax.configs import load_config
    from carryover_jax.errors import CarryoverError

    _, parser = _parsers()
    bad, n = [], 0
    for page, line, argv, _whole in _quoted_commands():
        try:
            args = parser.parse_args(argv)
        except SystemExit:  # refused by the parser: test_every_quoted_command_parses names it
            continue
        sets = [*(getattr(args, "set", None) or []), *(getattr(args, "continue_set", None) or [])]
        if not sets or not hasattr(args, "config"):
            continue
        n += 1
        try:  # the base config: a NAME:control_compute stage would time training steps to resolve itself
            apply_overrides(load_config(args.config.partition(":")[0]), sets)
        except CarryoverError as e:
            bad.append(f"{_rel(page)}: `{line}` -> {e}")
    assert n > 5, f"only {n} training commands with --set found"
    assert not bad, "overrides their config refuses:\n" + "\n".join(bad)
