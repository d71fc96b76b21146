"""``python -m signoff.hooks.mcp_proxy`` runs ``signoff-mcp-proxy``."""

from signoff.hooks.mcp_proxy._cli import main

main()
