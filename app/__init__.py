"""The Signoff server."""

from functools import cache


@cache
def version() -> str:
    """This release's version, as the installed package's metadata gives it."""
    # Imported here: importlib.metadata costs `signoff --help` more than typer's own start.
    from importlib.metadata import version as installed

    return installed("signoff")
