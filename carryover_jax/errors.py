"""User-facing errors: the CLI prints them as one line (`carryover <cmd>: error: ...`) and exits 2."""


class CarryoverError(Exception):
    """Bad input or an unsupported setting, explained in one line."""


class CheckpointError(CarryoverError):
    """A checkpoint is missing, incomplete, of the wrong architecture, or has wrong shapes."""


class ConfigError(CarryoverError):
    """A configuration value is invalid or inconsistent."""


class RequestError(CarryoverError):
    """A generation request that cannot run: bad sampling settings, a prompt longer than the context."""


class DataError(CarryoverError):
    """A data file (prompt JSONL, response store) is missing, unreadable or malformed."""


class TrainingError(CarryoverError):
    """Training cannot start or continue: unwritable output folder, full disk, non-finite loss."""


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first non-empty line of an exception's message (its type name when empty), shortened."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."
