"""The ``signoff`` console script.

``signoff hook claude-code`` is dispatched before anything of the server is
imported: a Claude Code command hook that crashes on import would exit 1, and
Claude Code lets the tool through on any exit code but 2.
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:3] == ["hook", "claude-code"]:
        try:
            from hooks.adapters.claude_code import main as claude_code

            code = claude_code(sys.argv[3:])
        except BaseException as exc:  # fail closed, whatever happened
            sys.stderr.write(f"signoff hook claude-code: {type(exc).__name__}: {exc}\n")
            code = 2
        sys.exit(code)
    from app.cli import main as cli

    cli()
