"""The docs check: README.md and every page under docs/ link only to what exists, every command they quote (`carryover
…`, `python -m carryover_jax.export.speculative …`) parses with that command's own parser (a dry parse: nothing
runs), every `--set KEY=VALUE` names a real config key (and, in a training command, holds a value its config
accepts), and the figure script draws its picture."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import shlex
import subprocess
import sys
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)
INLINE = re.compile(r"(?<!`)`((?:[^`\n]|\n(?![ \t]*\n))+)`(?!`)")  # a span may wrap, not cross a blank line
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SET = re.compile(r"--(set|continue-set|eval-set)[ =]([A-Za-z_][\w.]*)=")  # anywhere: prose, tables, code
SHELL_STOP = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "2>&1", "&"}
ALTERNATIVES = re.compile(r"^[\w.-]+(\|[\w.-]+)+$")
PROGRAMS = {  # the words that start a command -> its parser
    ("carryover",): "carryover_jax.cli:build_parser",
    ("python", "-m", "carryover_jax.export.speculative"): "carryover_jax.export.speculative:_parser",
}


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def _prose(text: str) -> str:
    """The text outside fenced code blocks (links and inline code live there)."""
    return FENCE.sub("", text)


# ---- links ----------------------------------------------------------------------------------------------
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
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", re.sub(r"[`*]", "", m.group(1)))
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def link_problems(page: Path, text: str) -> tuple[int, list[str]]:
    """(links checked, the ones that do not resolve) of one page's text."""
    bad, n = [], 0
    for target in LINK.findall(_prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: -- not ours to check
            continue
        n += 1
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            bad.append(f"{_rel(page)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{_rel(page)}: {target} (no heading #{anchor} in {_rel(dest)})")
    return n, bad


def test_every_relative_link_resolves():
    counts, bad = zip(*(link_problems(p, _text(p)) for p in PAGES))
    assert sum(counts) > 50, f"only {sum(counts)} links found: the extraction is broken"
    assert not sum(bad, []), "broken links:\n" + "\n".join(sum(bad, []))


# ---- quoted commands ------------------------------------------------------------------------------------
def _code_lines(text: str):
    """(line, whole): the shell lines of the fenced blocks (continuations joined), whole commands; then every inline
    code span, which may be a fragment naming a command and some of its options (`carryover eval --curve RUN`)."""
    for block in FENCE.finditer(text):
        for line in block.group(2).replace("\\\n", " ").splitlines():
            yield line, True
    for span in INLINE.findall(_prose(text)):
        yield " ".join(span.split()), False


def _command(line: str) -> tuple[tuple[str, ...], list[str]] | None:
    """(program, argv) of a quoted command line, or None if it runs none of PROGRAMS. Leading VAR=value assignments
    and a venv prefix (`.venv/bin/carryover`) are skipped; the command ends at a shell operator or a comment;
    optional groups `[...]` are left out (their placeholders are not values); a shell variable ($I) stands for 1."""
    line = re.sub(r"\[[^\[\]]*\]", " ", line)
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
        words = words[1:]
    if words:
        words[0] = Path(words[0]).name  # .venv/bin/carryover, .venv/bin/python
    prog = next((p for p in PROGRAMS if tuple(words[:len(p)]) == p), None)
    if prog is None or len(words) == len(prog) or words[len(prog)].endswith(":"):
        return None  # (`carryover train: error: ...` is what the CLI prints, not a command)
    argv = []
    for w in words[len(prog):]:
        if w in SHELL_STOP or w.startswith((">", "2>")):
            break
        argv.append(re.sub(r"^\$\{?\w+\}?$", "1", w))
    return prog, argv


def _expand(argv: list[str]) -> list[list[str]]:
    """One argv per alternative of a `a|b|c` word (a table's `zlab\\|deepspec`, `bench ar|decode|train`)."""
    out = [[]]
    for w in argv:
        options = w.split("|") if ALTERNATIVES.match(w) else [w]
        out = [a + [o] for a in out for o in options]
    return out


def _quoted_commands(pages=None):
    """(page, line, program, argv, whole) for every command the pages quote, one per alternative."""
    for page, text in pages or ((p, _text(p)) for p in PAGES):
        for line, whole in _code_lines(text):
            found = _command(line) if "carryover" in line else None
            if found:
                for argv in _expand(found[1]):
                    yield page, line.strip(), found[0], argv, whole


@functools.lru_cache(maxsize=None)
def _parsers() -> dict:
    """program -> (its parser, the same with no option required: inline fragments name options, not whole runs)."""
    import importlib

    out = {}
    for prog, where in PROGRAMS.items():
        module, fn = where.split(":")
        build = getattr(importlib.import_module(module), fn)
        lenient = build()
        subs = lenient._subparsers._group_actions[0].choices.values() if lenient._subparsers else []
        for p in [lenient, *subs]:
            for a in p._actions:
                a.required = False
        out[prog] = (build(), lenient)
    return out


def command_problems(pages=None) -> tuple[int, list[str]]:
    """(commands parsed, the ones their parser refuses, with its message)."""
    import contextlib
    import io

    bad, n = [], 0
    for page, line, prog, argv, whole in _quoted_commands(pages):
        n += 1
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                _parsers()[prog][0 if whole else 1].parse_args(argv)
        except SystemExit:
            msg = err.getvalue().strip().splitlines()
            bad.append(f"{_rel(page)}: `{line}` -> {msg[-1] if msg else 'exit'}")
    return n, bad


def test_every_quoted_command_parses():
    n, bad = command_problems()
    assert n > 80, f"only {n} commands found: the extraction is broken"
    assert not bad, "commands their parser refuses:\n" + "\n".join(bad)


# ---- config keys ----------------------------------------------------------------------------------------
def _config_keys(cls, prefix: str = "") -> set[str]:
    """Every dotted field path of a config dataclass (`data.max_len`, `loss.kl_weight`, `numerics.cache_dtype`)."""
    keys = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        keys.add(prefix + f.name)
        for sub in typing.get_args(hints[f.name]) or (hints[f.name],):
            if dataclasses.is_dataclass(sub):
                keys |= _config_keys(sub, f"{prefix}{f.name}.")
    return keys


def set_key_problems(pages=None) -> tuple[int, list[str]]:
    """(`--set`-style keys found, the ones no config has)."""
    from carryover_jax.config.train import TrainConfig
    from carryover_jax.eval.run import evaluate

    known = {"set": _config_keys(TrainConfig), "continue-set": _config_keys(TrainConfig),
             "eval-set": set(inspect.signature(evaluate).parameters)}
    bad, n = [], 0
    for page, text in pages or ((p, _text(p)) for p in PAGES):
        for flag, key in SET.findall(text):
            if key.isupper():  # a placeholder (`--set KEY=VALUE`), not a key
                continue
            n += 1
            if key not in known[flag]:
                bad.append(f"{_rel(page)}: --{flag} {key}=")
    return n, bad


def override_problems(pages=None) -> tuple[int, list[str]]:
    """(whole `prepare` / `train` / `pipeline` / `bench train` commands with overrides, the ones whose values their
    config refuses: type and range, what `--set` itself checks before anything runs)."""
    from carryover_jax.config import apply_overrides
    from carryover_jax.configs import load_config
    from carryover_jax.errors import CarryoverError

    parser = _parsers()[("carryover",)][1]
    bad, n = [], 0
    for page, line, prog, argv, _whole in _quoted_commands(pages):
        if prog != ("carryover",):
            continue
        try:
            args = parser.parse_args(argv)
        except SystemExit:  # refused by the parser: command_problems names it
            continue
        sets = [*(getattr(args, "set", None) or []), *(getattr(args, "continue_set", None) or [])]
        if not sets or not hasattr(args, "config"):
            continue
        n += 1
        try:  # the base config: a NAME:control_compute stage would time training steps to resolve itself
            apply_overrides(load_config(args.config.partition(":")[0]), sets)
        except CarryoverError as e:
            bad.append(f"{_rel(page)}: `{line}` -> {e}")
    return n, bad


def test_every_set_names_a_real_config_key():
    n, bad = set_key_problems()
    assert n > 30, f"only {n} --set found: the extraction is broken"
    assert not bad, "unknown config keys:\n" + "\n".join(bad)


def test_every_training_command_s_overrides_apply_to_its_config():
    n, bad = override_problems()
    assert n > 5, f"only {n} training commands with --set found"
    assert not bad, "overrides their config refuses:\n" + "\n".join(bad)


def test_the_check_finds_what_is_wrong():
    """Each check on a page made to fail, beside the same lines written right."""
    page = REPO / "docs" / "page.md"
    good = ("See [pods](pods.md#tpu) and `carryover train --config smollm2 --set steps=10`.\n\n"
            "```bash\n.venv/bin/carryover export --drafter d --format zlab \\\n  --out e   # a comment\n```\n")
    bad = ("See [pods](pods.md#gpus), [x](missing.md) and `carryover train --config smollm2 --set stepz=10`.\n\n"
           "```bash\nCUDA_VISIBLE_DEVICES=$GPU carryover export --drafter d --format onnx --out e\n"
           "python -m carryover_jax.export.speculative --target t --drafter d\n"
           "carryover train --config smollm2 --set steps=-3\n```\n")
    assert link_problems(page, good) == (1, [])
    assert [m.split(" (")[1] for m in link_problems(page, bad)[1]] == [
        "no heading #gpus in docs/pods.md)", "no such file)"]
    assert command_problems([(page, good)]) == (2, [])
    n, refused = command_problems([(page, bad)])
    assert n == 4 and len(refused) == 2
    assert "invalid choice: 'onnx'" in refused[0] and "required: --prompt" in refused[1]
    assert set_key_problems([(page, good)]) == (1, [])
    assert set_key_problems([(page, bad)]) == (2, ["docs/page.md: --set stepz="])
    assert override_problems([(page, good)]) == (1, [])
    n, refused = override_problems([(page, bad)])
    assert n == 2 and "steps must be an integer in [1, " in refused[0] and "unknown config key 'stepz'" in refused[1]


def test_the_readme_is_a_first_screen():
    """At most 12,000 characters, opening with the two fresh-machine commands; CI runs the second (`.ci/run`)."""
    text = _text(REPO / "README.md")
    assert len(text) <= 12_000, f"README.md has {len(text):,} characters: move the detail into docs/"
    first = FENCE.search(text).group(2).splitlines()
    assert [line.split("#")[0].strip() for line in first] == ["bash launch/run_default.sh", "bash launch/test.sh"]
    assert "launch/test.sh" in _text(REPO / ".ci" / "run")


# ---- figures --------------------------------------------------------------------------------------------
def test_the_round_figure_script_draws_it(tmp_path):
    out = tmp_path / "round.png"
    subprocess.run([sys.executable, str(REPO / "docs" / "figures" / "carryover_round.py"), "--out", str(out)],
                   check=True, capture_output=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (REPO / "docs" / "figures" / "carryover-round.png").is_file()
