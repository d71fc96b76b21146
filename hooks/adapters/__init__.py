"""Adapters that attach the Signoff gate to agent runtimes.

Each lives in its own module and imports its framework only when imported itself:

- :mod:`signoff.hooks.adapters.claude_code` — the ``signoff hook claude-code`` PreToolUse command hook
  (no extra dependency);
- :mod:`signoff.hooks.adapters.pydantic_ai` — a Pydantic AI capability (``signoff-hooks[pydantic-ai]``);
- :mod:`signoff.hooks.adapters.langchain` — a LangChain v1 agent middleware (``signoff-hooks[langchain]``);
- :mod:`signoff.hooks.adapters.openai_agents` — OpenAI Agents SDK approvals
  (``signoff-hooks[openai-agents]``).
"""

__all__: list[str] = []
