from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hooks.signoff_fakes import LiveSignoff


@pytest.fixture
def live() -> Iterator[LiveSignoff]:
    """A real Signoff-like HTTP server on 127.0.0.1 that gates every call."""
    server = LiveSignoff().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see only the Signoff configuration they set themselves."""
    monkeypatch.delenv("SIGNOFF_URL", raising=False)
    monkeypatch.delenv("SIGNOFF_API_KEY", raising=False)
    monkeypatch.delenv("SIGNOFF_HOOK_TIMEOUT", raising=False)
