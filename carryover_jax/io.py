"""Small I/O helpers: outputs are written completely or not at all."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from carryover_jax.errors import CarryoverError


TMP_TAG = ".tmp-"
COMPLETE = ".complete"  # written last into an atomic folder: a folder without it is not trusted


@contextlib.contextmanager
def exclusive(folder: str | os.PathLike, what: str):
    """Hold the lock of `folder` for the block: a second process that would write it (a job submitted twice, a
    requeue while the first still runs) is one error instead of two writers interleaving checkpoints or records.
    An flock on the hidden sibling `.<name>.lock` (the folder itself may be created by an atomic rename, or
    have to be empty): the kernel drops it when the holder dies, so a killed run leaves no stale lock; the file
    stays, holding the last holder's pid and host for the message."""
    folder = Path(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        f = open(folder.parent / f".{folder.name}.lock", "a+")
    except OSError as e:
        raise CarryoverError(f"cannot write next to {folder} ({e.strerror or e})") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise CarryoverError(f"{folder} is being written by another {what} ({holder}): wait for it to end, or "
                             "use another folder") from None
    try:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}")
        f.flush()
        yield folder
    finally:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner() -> str:
    """PID.HOST of this process: temporary folders on shared storage are only cleaned by their own host."""
    return f"{os.getpid()}.{hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]}"


def clean_stale_tmp(folder: str | os.PathLike) -> list[Path]:
    """Remove `.NAME.tmp-PID.HOST-*` / `.NAME.old-PID.HOST-*` siblings of `folder` left by a killed writer
    (one of this host whose process is gone)."""
    folder = Path(folder)
    removed = []
    if not folder.parent.is_dir():
        return removed
    host = _owner().split(".")[1]
    for tag in (TMP_TAG, ".old-"):
        for p in folder.parent.glob(f".{folder.name}{tag}*"):
            try:
                pid, h = p.name[len(folder.name) + 1 + len(tag):].split("-")[0].split(".")
                pid = int(pid)
            except ValueError:
                continue
            if h == host and pid != os.getpid() and not _pid_alive(pid):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def is_complete(folder: str | os.PathLike) -> bool:
    """Whether `folder` was finished by `atomic_dir` (holds its completion marker)."""
    return (Path(folder) / COMPLETE).is_file()


def atomic_dir(folder: str | os.PathLike, write: Callable[[Path], None], *,
               replaces: Sequence[str] | Callable[[Path], bool] | None = None) -> Path:
    """Fill a temporary sibling folder with `write(tmp)`, then rename it to `folder` (replacing it).

    A writer killed at any point leaves either the previous complete folder or no folder at `folder`
    (plus a hidden `.NAME.tmp-PID-*` sibling that the next writer removes). The files are fsynced
    before the rename and a `.complete` marker is written last, so readers can tell a finished folder.
    `replaces`: file names one of which an existing non-empty `folder` must hold to be replaced, or a
    predicate on the folder (so a mistyped `--out ~/` is refused instead of deleted); None replaces anything.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise CarryoverError(f"{folder} exists and is not a folder")
    if replaces is not None and folder.is_dir() and any(folder.iterdir()) and not (
            replaces(folder) if callable(replaces) else is_complete(folder) or any((folder / n).exists()
                                                                                   for n in replaces)):
        raise CarryoverError(
            f"{folder} exists and holds something else than this command writes; refusing to replace it "
            "(choose a new or empty folder)"
        )
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CarryoverError(f"cannot create {folder.parent}: {e.strerror or e}") from None
    clean_stale_tmp(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}{TMP_TAG}{_owner()}-", dir=folder.parent))
    aside = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; a checkpoint folder should be shareable
        write(tmp)
        for p in tmp.rglob("*"):
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)
            if p.is_file():
                _fsync(p)
        (tmp / COMPLETE).write_text("")
        _fsync(tmp)
        if folder.exists():
            aside = folder.parent / f".{folder.name}.old-{_owner()}-{tmp.name[-8:]}"
            os.replace(folder, aside)
        os.replace(tmp, folder)
        _fsync(folder.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None and aside.exists() and not folder.exists():
            os.replace(aside, folder)  # put the previous complete folder back
            aside = None
        raise
    finally:
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    return folder


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def read_json(path: str | os.PathLike, what: str = "file", *, expect: type = dict, error=None) -> Any:
    """Parse a JSON file; a missing, empty, unreadable or malformed file (or one whose top level is not
    `expect`) raises `error` (a CarryoverError subclass) with one line naming the file."""
    error = error or CarryoverError
    path = Path(path)
    if not path.is_file():
        raise error(f"missing {what} {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"cannot read {what} {path} ({getattr(e, 'strerror', None) or e})") from None
    if not text.strip():
        raise error(f"empty {what} {path}")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"invalid JSON in {what} {path} ({e.msg} at line {e.lineno})") from None
    if expect is not None and not isinstance(obj, expect):
        raise error(f"{what} {path} holds a JSON {type(obj).__name__}, expected a {expect.__name__}")
    return obj
