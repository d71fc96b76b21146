"""Where the console scripts start: a top-level module, outside the ``signoff`` namespace.

``signoff.hooks`` lives in the namespace package ``signoff``. A project's own ``signoff``
package (or module) earlier on the Python path hides that namespace, and a script whose
entry point is inside it dies on its first line with exit 1, which an older Claude Code
takes as "run the tool". Starting here, under a name no project uses, with nothing
imported but ``sys`` before the ``try``, every failure to load exits 2 with one line on
stderr naming the cause and the fix: ``signoff-hook`` blocks the call, and
``signoff-mcp-proxy`` does not start, so nothing reaches the upstream server.

The server distribution's ``signoff`` script starts here too (it requires this distribution
at its own version): ``signoff hook claude-code`` is ``signoff-hook claude-code``, with the
same exit 2.
"""

import sys

__all__ = ["EXIT_CANNOT_LOAD", "hook", "mcp_proxy", "server", "verify"]

EXIT_CANNOT_LOAD = 2
"""Both scripts' status when they cannot load: the one code with which Claude Code blocks a
call, and the proxy's status for "could not start"."""


def hook() -> None:
    """``signoff-hook``: :func:`signoff.hooks._entry.main`, or exit 2 when it cannot be loaded."""
    try:
        from signoff.hooks._entry import main
    except BaseException as exc:
        raise SystemExit(_cannot_load("Blocked by the Signoff approval hook", exc)) from None
    main()


def mcp_proxy() -> None:
    """``signoff-mcp-proxy``: :func:`signoff.hooks.mcp_proxy.main`, or exit 2 when it cannot be loaded."""
    try:
        from signoff.hooks.mcp_proxy._cli import main
    except BaseException as exc:
        raise SystemExit(_cannot_load("signoff-mcp-proxy", exc)) from None
    main()


def verify() -> None:
    """``signoff-verify``: :func:`signoff.hooks.receipts.main`, or exit 2 when it cannot be loaded."""
    try:
        from signoff.hooks.receipts import main
    except BaseException as exc:
        raise SystemExit(_cannot_load("signoff-verify", exc)) from None
    raise SystemExit(main())


def server() -> None:
    """``signoff``: ``signoff hook claude-code …`` is :func:`hook` (exit 2 when the hook cannot
    be loaded); every other command is the server's :func:`signoff.app.cli.main`."""
    if sys.argv[1:3] == ["hook", "claude-code"]:
        del sys.argv[1]  # what the hook's own command line reads: ``claude-code …``
        hook()
        return
    try:
        from signoff.app.cli import main
    except BaseException as exc:
        raise SystemExit(_cannot_load("signoff", exc, distribution="signoff")) from None
    main()


# Where each distribution is in a checkout (neither is on the package index yet).
_FOLDER = {"signoff-hooks": "/hooks", "signoff": ""}


def _cannot_load(prefix: str, exc: BaseException, *, distribution: str = "signoff-hooks") -> int:
    try:
        sys.stderr.write(f"{prefix}: {_why(exc, distribution)}\n")
        sys.stderr.flush()
    except BaseException:
        pass
    return EXIT_CANNOT_LOAD


def _why(exc: BaseException, distribution: str) -> str:
    """One line: what kept ``distribution`` from loading, and what to do about it."""
    try:
        found = _shadow()
    except BaseException:
        found = None
    if found is None:
        return (
            f"{distribution} cannot be loaded ({type(exc).__name__}: {exc}); "
            # signoff.hooks._install.install_hint's words: nothing of signoff loads here.
            f"reinstall it: pip install --force-reinstall "
            f"'<signoff checkout>{_FOLDER.get(distribution, '')}' "
            "(it is not on the package index yet)"
        )
    import os

    name, origin = found
    package = origin.endswith("__init__.py")
    where = os.path.dirname(origin) if package else origin
    entry = where
    for _ in name.split("."):
        entry = os.path.dirname(entry)
    if entry == os.getcwd():
        entry += " (the current directory)"
    kind = "package" if package else "module"
    return (
        f"a {kind} named {name!r} at {where} shadows {distribution}; "
        f"rename it, or take {entry} off the Python path (PYTHONPATH)"
    )


def _shadow() -> tuple[str, str] | None:
    """The name and file of the module that hides signoff-hooks' packages, if one does.

    signoff-hooks' ``signoff`` is a namespace package, so a ``signoff`` with a file of its
    own is someone else's; a ``signoff.hooks`` without the hook in it is someone else's too.
    """
    from importlib.util import find_spec

    top = find_spec("signoff")
    if top is None:
        return None
    if top.origin is not None:
        return "signoff", top.origin
    hooks = find_spec("signoff.hooks")
    if hooks is None or hooks.origin is None:
        return None
    try:
        ours = find_spec("signoff.hooks._entry") is not None
    except BaseException:
        ours = False
    return None if ours else ("signoff.hooks", hooks.origin)
