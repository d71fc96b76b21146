"""How to install signoff-hooks, for the messages that name it: it is not on the package index
yet, so it comes from a checkout of Signoff (its ``hooks/`` folder, or the wheel ``make dist``
builds from it)."""

__all__ = ["install_hint"]


def install_hint(extra: str | None = None) -> str:
    """``pip install '<signoff checkout>/hooks[mcp]' (…not on the package index yet)``."""
    spec = f"[{extra}]" if extra else ""
    return f"pip install '<signoff checkout>/hooks{spec}' (signoff-hooks is not on the package index yet)"
