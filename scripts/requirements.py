"""Print the server's third-party requirements, one a line, from the pyproject files alone.

The Docker image installs these in a layer of their own, before the code is copied in, so
that a code change rebuilds only the layer that installs Signoff itself (``--no-deps``):

    python scripts/requirements.py slack feishu email > requirements.txt

Arguments name the extras to include. The repository's own distributions (signoff-hooks) are
left out; their requirements are printed instead. Needs nothing but Python 3.11.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OWN = {"signoff-hooks": ROOT / "hooks" / "pyproject.toml"}
"""The distributions built from this repository, by name: their own pyproject files."""


def _name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise SystemExit(f"cannot read the requirement {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(extras: list[str]) -> list[str]:
    """The third-party requirements of the server with ``extras``, in the files' order."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"no extra {unknown[0]!r} in pyproject.toml: name one of {', '.join(optional)}")
    wanted = [*project["dependencies"], *(r for e in extras for r in optional[e])]
    out: list[str] = []
    for requirement in wanted:
        own = OWN.get(_name(requirement))
        if own is None:
            out.append(requirement)
            continue
        inner = tomllib.loads(own.read_text(encoding="utf-8"))["project"]
        out.extend(inner.get("dependencies", []))
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    sys.stdout.write("".join(f"{r}\n" for r in requirements(sys.argv[1:])))
