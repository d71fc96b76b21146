"""Signoff's own credentials in a gated call's arguments: an agent's key (``sk_signoff_…``)
authenticates as that agent, a personal token (``sop_…``) decides as its person. Both are
secrets known by their issuer's prefix, as a GitHub or Slack token is: masked before the call
is stored, so that no card, console page, API answer or webhook shows them to whoever reads
the request (a chat channel's members, who could then decide as the token's person)."""

from __future__ import annotations

import json
import secrets

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from signoff.app.config import DEFAULT_REDACT
from signoff.app.console.auth import ConsoleSession, Keys
from signoff.app.keys import PREFIX
from signoff.app.redaction import REDACTED, redact
from tests.conftest import ADMIN_TOKEN
from tests.redteam.support import property_test
from tests.redteam.test_route_credentials import (  # noqa: F401  (fixtures)
    SENTINEL,
    World,
    ask,
    bearer,
    config,
    password_hashes,
    settings,
    world,
)

pytestmark = pytest.mark.postgres

WORDS = frozenset(DEFAULT_REDACT)


async def test_keys_and_personal_tokens_in_arguments_are_masked_everywhere_the_call_is_shown(
    world: World,  # noqa: F811
) -> None:
    held = {
        "another agent's key": world.key_b,
        "a personal token": world.personal,
        "a personal token made through the identity provider": world.oidc_personal,
    }
    arguments = {
        "amount": 90000,
        "memo": f"{SENTINEL} then use {world.key_b} for the retry",
        "note": world.personal,
        "lines": [f"echo {world.oidc_personal} > ~/.signoff"],
    }
    async with world.client() as http:
        answer = await ask(http, world.key_a, "pay_invoice", **arguments)
        assert answer["decision"] == "pending", answer
        rid = answer["request_id"]
        shown = {
            "the pre-tool-use answer": json.dumps(answer["request"]),
            "the agent API": (await http.get(f"/v1/requests/{rid}", headers=bearer(world.key_a))).text,
            "the operator API": (
                await http.get(f"/v1/admin/requests/{rid}", headers=bearer(ADMIN_TOKEN))
            ).text,
            "the console": (
                await http.get(f"/ui/requests/{rid}", headers={"Cookie": f"signoff_session={world.session}"})
            ).text,
        }
    async with world.runtime.sessions() as s:
        row = (await s.exec(sa.text(f"SELECT arguments FROM confirmation_request WHERE id = '{rid}'"))).one()
        shown["the stored request"] = str(row[0])
    for where, text in shown.items():
        assert SENTINEL in text, where  # the call itself is shown
        leaked = [what for what, value in held.items() if value in text]
        assert leaked == [], f"{where} shows {leaked}"


def _personal_tokens() -> st.SearchStrategy[str]:
    """Personal tokens as the console makes them: a password operator's, or a provider's sign-in
    with claims (long enough that the payload is compressed, starting with a dot)."""
    groups = st.lists(st.text("abcdefghijklmnop-", min_size=1, max_size=12), max_size=30)

    def made(operator: str, person: list[str] | None) -> str:
        claims = (
            None if person is None else {"issuer": "https://id.example", "subject": "s", "groups": person}
        )
        session = ConsoleSession.start(86400, operator=operator, fingerprint="f" * 16, person=claims)
        return Keys(secrets.token_urlsafe(24), max_age=3600).encode_token(session)

    return st.builds(
        made, st.text("abcdefghijklmnopqrstuvwxyz.@", min_size=1, max_size=40), st.none() | groups
    )


@property_test(150)
@given(
    credential=st.one_of(
        st.builds(lambda: f"{PREFIX}{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}"), _personal_tokens()
    ),
    before=st.sampled_from(["", " ", "key ", "(", '"', "=", "\n", "use:", "Bearer "]),
    after=st.sampled_from(["", " ", ")", '"', ",", ".", "\n", " now"]),
)
def test_a_key_or_personal_token_inside_any_text_is_masked(credential: str, before: str, after: str) -> None:
    shown = redact({"text": before + credential + after}, WORDS)["text"]
    assert credential not in shown
    assert REDACTED in shown
    # Masked whole: no part of it long enough to use is left.
    assert credential[-12:] not in shown, shown
    assert shown.startswith(before), shown


def test_prose_that_begins_like_one_is_left_alone() -> None:
    for text in ("sop_ and sk_signoff_ are prefixes", "the sop_list.txt file", "sk_signoff_ keys"):
        assert redact({"text": text}, WORDS)["text"] == text
