"""The Signoff server."""

from functools import cache
from importlib.metadata import version as _installed


@cache
def version() -> str:
    """This release's version, as the installed package's metadata gives it."""
    return _installed("signoff")
