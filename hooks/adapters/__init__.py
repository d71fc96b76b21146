"""Adapters that attach the Signoff gate to agent runtimes.

Each lives in its own module and imports its framework only when imported itself:

- :mod:`hooks.adapters.claude_code` — the ``signoff hook claude-code`` PreToolUse command hook
  (no extra dependency);
- :mod:`hooks.adapters.pydantic_ai` — a Pydantic AI capability (``signoff[pydantic-ai]``);
- :mod:`hooks.adapters.langchain` — a LangChain v1 agent middleware (``signoff[langchain]``);
- :mod:`hooks.adapters.openai_agents` — OpenAI Agents SDK approvals (``signoff[openai-agents]``).
"""

__all__: list[str] = []
