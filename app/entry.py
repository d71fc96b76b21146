"""The ``signoff`` console script.

``signoff hook claude-code`` is dispatched before anything of the server is
imported (it is ``signoff-hook claude-code``): a Claude Code command hook that
crashes on import would exit 1, and Claude Code lets the tool through on any
exit code but 2.
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:3] == ["hook", "claude-code"]:
        from signoff.hooks._entry import run_claude_code

        sys.exit(run_claude_code(sys.argv[3:]))
    from signoff.app.cli import main as cli

    cli()
