"""User-facing errors: one line that names the offending key, file or value."""


class MoespacError(Exception):
    """An error caused by user input or environment; the CLI prints it on one line and exits 2."""


def require(condition: bool, message: str) -> None:
    """Raise MoespacError(message) unless condition holds."""
    if not condition:
        raise MoespacError(message)
