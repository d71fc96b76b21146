"""``signoff-mcp-proxy``: gate any MCP server's tools through Signoff, with no change to the server.

The proxy sits between an MCP client (Claude Code, Cursor, any MCP SDK) and one
upstream MCP server::

    signoff-mcp-proxy --name github -- npx -y @modelcontextprotocol/server-github   # a stdio upstream
    signoff-mcp-proxy --name github --url https://api.githubcopilot.com/mcp/ \\
        --header-env Authorization=GITHUB_AUTH                                       # a streamable-HTTP one

It serves stdio (or streamable HTTP with ``--listen HOST:PORT``) and relays
``tools/list``, resources and their subscriptions, prompts, completions, logging and
notifications unchanged, to clients of both protocol eras; the upstream's own requests
to its client (sampling, elicitation, roots) go to the client whose call they concern
(see :mod:`signoff.hooks.mcp_proxy._clients`). Each ``tools/call`` is asked of Signoff
first, as tool ``mcp__<NAME>__<tool>`` (Claude Code's naming, so one gate config serves
both):

==============================  ==========================================================
Signoff says                    the client gets
==============================  ==========================================================
allow                           the upstream's result, unchanged (run with the approved
                                arguments when an approver edited them)
deny                            an ``isError`` result with the reason; not run
pending                         held up to ``--hold`` seconds (default 50), with progress
                                notifications when the client sent a progress token; then,
                                if still undecided, an ``isError`` result naming the request
                                and saying that calling again with the same arguments keeps
                                waiting (the retry re-attaches to the same request)
unreachable, malformed, a bug   an ``isError`` result saying why; not run
==============================  ==========================================================

Tasks are not relayed: the proxy offers no task augmentation (a ``tools/call`` sent as a
task is gated and answered as a plain call) and refuses ``tasks/*``. Every executed call
is reported (``POST /v1/hooks/post-tool-use``) with the idempotency key it was allowed
under. See :class:`~signoff.hooks.mcp_proxy._calls.CallLedger` for how keys are chosen,
and ``docs/mcp.md`` for client configuration. Requires the ``mcp`` extra:
``pip install '<signoff checkout>/hooks[mcp]'``.
"""

from signoff.hooks.mcp_proxy._cli import main
from signoff.hooks.mcp_proxy._config import DEFAULT_HOLD, ConfigError, ProxyConfig, parse_args

__all__ = ["DEFAULT_HOLD", "ConfigError", "ProxyConfig", "main", "parse_args"]
