"""The ``signoff-hook`` console script: ``signoff-hook claude-code [--timeout S] …``.

The script starts in the top-level ``_signoff_hooks_entry``, which exits 2 if this module
cannot be loaded (a ``signoff`` package of the project's own hiding it, say). Nothing is
imported here before the ``try`` either: a hook whose adapter fails to import (a broken
install, a missing dependency) must still exit 2, the one exit code with which Claude Code
blocks the call rather than running the tool.
"""

import sys

EXIT_BLOCK = 2


def run_claude_code(argv: list[str]) -> int:
    """The Claude Code hook, failing closed whatever happens, even on import."""
    try:
        from signoff.hooks.adapters.claude_code import main

        return main(argv)
    except BaseException as exc:
        try:
            sys.stderr.write(f"Blocked by the Signoff approval hook: {type(exc).__name__}: {exc}\n")
        except BaseException:
            pass
        return EXIT_BLOCK


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] in (["-h"], ["--help"]):
        sys.exit(run_claude_code(["--help"]))
    if argv[:1] != ["claude-code"]:
        sys.stderr.write(
            "signoff-hook: name the runtime: signoff-hook claude-code [OPTIONS] "
            "(signoff-hook --help lists them)\n"
        )
        sys.exit(EXIT_BLOCK)
    sys.exit(run_claude_code(argv[1:]))
