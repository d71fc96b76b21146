"""``/docs`` and ``/redoc`` work offline: every script, style sheet and image they load is
served by Signoff itself, and answers."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import httpx
import pytest

# src="…", href="…", spec-url="…" (ReDoc), and the schema's url: '…' in Swagger UI's set-up script
_REFERENCES = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']|\burl\s*:\s*["']([^"']+)["']""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_api_docs_load_nothing_from_elsewhere(http: httpx.AsyncClient, page: str) -> None:
    answer = await http.get(page)
    assert answer.status_code == 200
    found = [a or b for a, b in _REFERENCES.findall(answer.text)]
    assert any(u.endswith(".js") for u in found), found
    assert "/openapi.json" in found, found
    for reference in found:
        parts = urlsplit(reference)
        assert (parts.scheme, parts.netloc) == ("", ""), f"{page} loads {reference} from elsewhere"
        assert reference.startswith("/"), reference
        loaded = await http.get(reference)
        assert loaded.status_code == 200, (reference, loaded.status_code)
        assert loaded.content
