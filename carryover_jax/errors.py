"""User-facing errors: the CLI prints them as one line and exits non-zero."""


class CarryoverError(Exception):
    """Bad input or an unsupported setting, explained in one line."""


class CheckpointError(CarryoverError):
    """A checkpoint is missing, incomplete, of the wrong architecture, or has wrong shapes."""


class ConfigError(CarryoverError):
    """A configuration value is invalid or inconsistent."""
