"""The order test files reach the xdist workers: longest first, from `file_seconds.json` (each file's measured
test time), so the last files the two workers run are short ones and both end at about the same time.

xdist's `--dist loadfile` hands a worker the next file whenever it has two or fewer tests left; by default it
first sorts the files by how many tests they hold, which put the one-test files that run a minute or more
(the pipeline, multi-host, the real model) last, and one worker ran them while the other sat idle.
`launch/test.sh` passes `--no-loadscope-reorder`, so the collection order below is the order they go out in.

`CARRYOVER_TEST_TIMES=write` merges the run's files into the table (the sum of every test's setup, call and
teardown per file, as the workers report them)."""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")
_measured: dict[str, float] = defaultdict(float)


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_files_first(items: list) -> None:
    """Reorder `items` in place: files by their recorded seconds, longest first (a file the table does not
    know counts as its median), each file's tests kept together and in their own order."""
    table = json.loads(TABLE.read_text()) if TABLE.is_file() else {}
    default = statistics.median(table.values()) if table else 0.0
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(_file(item.nodeid), i)
    items.sort(key=lambda it: (-table.get(_file(it.nodeid), default), first[_file(it.nodeid)]))


def record(report) -> None:
    """Add a test phase's duration to its file (on the controlling process; workers report to it)."""
    if os.environ.get("CARRYOVER_TEST_TIMES") == "write" and not os.environ.get("PYTEST_XDIST_WORKER"):
        _measured[_file(report.nodeid)] += report.duration


def write_table() -> None:
    """Merge the files this run measured into the table (a run of a few files updates those only)."""
    if _measured and not os.environ.get("PYTEST_XDIST_WORKER"):
        table = json.loads(TABLE.read_text()) if TABLE.is_file() else {}
        table.update({f: round(s, 1) for f, s in _measured.items()})
        TABLE.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
