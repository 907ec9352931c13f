"""The built-in source "pycode" (train/code_prompts.py) on hand-written module trees: which functions become stubs,
the stub text, the sha1 order, the de-duplication, and the source through `conversations` (split, chat messages)."""

import hashlib

from carryover_jax.config import DataConfig
from carryover_jax.train import code_prompts as C
from carryover_jax.train.sources import conversations

MOD = '''"""A module."""
import functools


@functools.lru_cache
def area(width,
         height=1):
    """Return the area of a width x height rectangle.

    >>> area(2, 3)
    6
    """
    return width * height


def _private(x):
    """A private helper that is long enough to qualify otherwise."""


def nodoc(x):
    return x


def noargs():
    """Takes no argument at all, so there is nothing to ask about."""


def short(x):
    """Too short."""


async def fetch(url):
    """An async function: not a plain def, left out of the stubs."""


class Box:
    def grow(self, k):
        """A method, not a top-level function: left out of the stubs."""


def scale(v, *, by):
    """Multiply every element of v by the keyword-only factor `by`."""
    return [x * by for x in v]
'''

AREA = '''def area(width,
         height=1):
    """Return the area of a width x height rectangle.

    >>> area(2, 3)
    6
    """'''
SCALE = '''def scale(v, *, by):
    """Multiply every element of v by the keyword-only factor `by`."""'''
TABBED = 'def tabbed(x):\n\t"""Indented with a tab: the stub would reach the target with mixed indentation."""\n'


def _tree(tmp_path):
    a = tmp_path / "a"
    (a / "pkg" / "tests").mkdir(parents=True)
    (a / "human_eval").mkdir()
    (a / "pkg" / "mod.py").write_text(MOD)
    (a / "pkg" / "tabs.py").write_text(TABBED)
    (a / "pkg" / "broken.py").write_text("def f(:\n")  # unparsable: skipped, not an error
    (a / "pkg" / "latin.py").write_bytes(b'def g(x):\n    """' + b"caf\xe9 " * 8 + b'"""\n')  # not UTF-8
    doc = '    """A function in a folder or file the source never reads from."""\n'
    (a / "pkg" / "tests" / "helpers.py").write_text("def helper(x):\n" + doc)
    (a / "pkg" / "test_mod.py").write_text("def check(x):\n" + doc)
    (a / "human_eval" / "data.py").write_text("def read_problems(path):\n" + doc)
    b = tmp_path / "b"
    (b / "other").mkdir(parents=True)
    # the same stub text under another name, and the same name (pkg.mod.scale) in a second root: both dropped
    (b / "other" / "copy.py").write_text(SCALE + "\n")
    (b / "pkg").mkdir()
    (b / "pkg" / "mod.py").write_text('def scale(v, w):\n    """Another scale with the same id as the first root."""\n')
    (b / "other" / "extra.py").write_text('def extra(v):\n    """One more qualifying function in the second root."""\n')
    return a, b


def test_stubs_of_a_module_tree(tmp_path):
    a, b = _tree(tmp_path)
    assert list(C.module_stubs(a)) == [("pkg.mod.area", AREA), ("pkg.mod.scale", SCALE)]
    rows = C.code_prompts((a, b))
    ids = ["code:pkg.mod.area", "code:pkg.mod.scale", "code:other.extra.extra"]
    assert [cid for cid, _ in rows] == sorted(ids, key=lambda i: hashlib.sha1(i[len("code:"):].encode()).hexdigest())
    prompts = dict(rows)
    assert prompts["code:pkg.mod.area"] == ("Write a solution to the following problem and make sure that it passes "
                                            f"the tests:\n```python\n{AREA}\n```")
    assert "Another scale" not in "".join(prompts.values())


def test_the_source_through_conversations(tmp_path, monkeypatch):
    a, b = _tree(tmp_path)
    monkeypatch.setattr(C, "default_roots", lambda: (a, b))
    train = list(conversations(DataConfig(source="pycode", heldout_per_mille=0)))
    held = list(conversations(DataConfig(source="pycode", split="heldout", heldout_per_mille=1000)))
    assert [c.id for c in train] == [c.id for c in held] == [cid for cid, _ in C.code_prompts((a, b))]
    first = train[0]
    assert first.prompt == [{"role": "user", "content": dict(C.code_prompts((a, b)))[first.id]}]
