"""The built-in hooks an agent's configuration names by ``type`` (``confirmation_gate``, …).

They run on the server, inside the hook registry of :mod:`signoff.hooks`, and may use
what the server has (CEL, pydantic); the agent-side package never imports them.
"""
