"""The Teams channel against a fake Bot Framework on loopback: every invoke's JWT is verified
before anything is applied (each refusal here leaves the handler uncalled), the card's
``Action.Execute`` data becomes a click, and connector failures become the outbox's errors."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from signoff.app.config import ConfigError, parse_config
from signoff.channels import (
    CallbackRejected,
    GrantChoice,
    PermanentDeliveryError,
    Person,
    RetryableDeliveryError,
)
from signoff.channels._clicks import NOT_RECORDED, RECORDING
from signoff.channels.teams import TeamsChannel, TeamsConfig, render_card, render_reminder
from tests.channels.feishu_support import RecordingHandler, decided, make_card
from tests.channels.teams_fake import APP_ID, CONVERSATION, TENANT, FakeBotFramework, Scripted

ALICE = "0a11ce00-0000-4000-8000-000000000001"


@pytest.fixture
async def fake() -> AsyncIterator[FakeBotFramework]:
    fake = FakeBotFramework()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.close()


@pytest.fixture
async def channel(fake: FakeBotFramework) -> AsyncIterator[TeamsChannel]:
    channel = TeamsChannel("ops-teams", TeamsConfig.model_validate(fake.config()), key_cooldown=0)
    try:
        yield channel
    finally:
        await channel.aclose()


def actions(card: dict[str, Any]) -> list[dict[str, Any]]:
    """Every action of a card, those inside its show-cards included."""
    found: list[dict[str, Any]] = []
    for action in card.get("actions", []):
        found.append(action)
        if action["type"] == "Action.ShowCard":
            found += actions(action["card"])
    return found


def executes(card: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in actions(card) if a["type"] == "Action.Execute"]


# Verification: each of these is refused before the click reaches the handler.


async def test_a_signed_invoke_is_applied_and_answered_with_the_card(
    fake: FakeBotFramework, channel: TeamsChannel
) -> None:
    handler = RecordingHandler()
    body, headers = fake.invoke(fake.activity("req-1", "approve", aad=ALICE, name="Alice Liu"))
    reply = await channel.handle_callback(body, headers, handler)
    [click] = handler.clicks
    assert (click.request_id, click.verdict, click.user_id, click.user_name) == (
        "req-1",
        "approve",
        ALICE,
        "Alice Liu",
    )
    assert click.conversation == CONVERSATION  # the thread's ;messageid= is not part of it
    assert click.identity["tenant_id"] == TENANT
    assert click.identity["teams_user_id"].startswith("29:")
    assert reply.body is not None
    assert reply.body["statusCode"] == 200
    assert reply.body["type"] == "application/vnd.microsoft.card.adaptive"
    assert executes(reply.body["value"]) == []  # decided: no actions left


@pytest.mark.parametrize(
    "forge",
    [
        "forged signature",
        "unknown kid",
        "wrong audience",
        "expired",
        "wrong issuer",
        "serviceUrl mismatch",
        "not yet valid",
        "no serviceurl claim",
        "HS256",
        "no token",
        "not endorsed for the channel",
    ],
)
async def test_forged_or_mismatched_tokens_are_refused(
    fake: FakeBotFramework, channel: TeamsChannel, forge: str
) -> None:
    handler = RecordingHandler()
    activity = fake.activity("req-1", "approve", aad=ALICE)
    now = int(time.time())
    token: str | None = None
    if forge == "forged signature":
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        token = fake.sign(fake.claims(), key=other)  # the published kid, another key
    elif forge == "unknown kid":
        token = fake.sign(fake.claims(), kid="not-published", key=fake.keys[fake.kid])
    elif forge == "wrong audience":
        token = fake.sign(fake.claims(aud="00000000-0000-0000-0000-000000000000"))
    elif forge == "expired":
        token = fake.sign(fake.claims(nbf=now - 7200, exp=now - 120))
    elif forge == "wrong issuer":
        token = fake.sign(fake.claims(iss="https://sts.windows.net/" + TENANT + "/"))
    elif forge == "serviceUrl mismatch":
        token = fake.sign(fake.claims(serviceurl="https://smba.trafficmanager.net/emea/"))
    elif forge == "not yet valid":
        token = fake.sign(fake.claims(nbf=now + 600))
    elif forge == "no serviceurl claim":
        token = fake.sign(fake.claims(serviceurl=None))
    elif forge == "HS256":
        token = __import__("jwt").encode(
            fake.claims(), "s" * 32, algorithm="HS256", headers={"kid": fake.kid}
        )
    elif forge == "not endorsed for the channel":
        fake.endorsements[fake.kid] = ["webchat"]
    body, headers = fake.invoke(activity, token=token)
    if forge == "no token":
        del headers["authorization"]
    with pytest.raises(CallbackRejected) as refused:
        await channel.handle_callback(body, headers, handler)
    assert refused.value.status_code in (401, 403)
    assert handler.clicks == []


async def test_the_activity_cannot_claim_another_service_url_than_its_token(
    fake: FakeBotFramework, channel: TeamsChannel
) -> None:
    handler = RecordingHandler()
    activity = fake.activity("req-1", "approve", aad=ALICE)
    token = fake.sign(fake.claims())
    activity["serviceUrl"] = "https://attacker.example/teams/"
    body, headers = fake.invoke(activity, token=token)
    with pytest.raises(CallbackRejected, match="serviceUrl"):
        await channel.handle_callback(body, headers, handler)
    assert handler.clicks == []


async def test_a_rotated_key_is_fetched_and_keys_are_cached(
    fake: FakeBotFramework, channel: TeamsChannel
) -> None:
    handler = RecordingHandler()
    await channel.handle_callback(*fake.invoke(fake.activity("r1", aad=ALICE)), handler)
    await channel.handle_callback(*fake.invoke(fake.activity("r2", aad=ALICE)), handler)
    assert fake.key_fetches == 1  # cached
    fake.rotate(keep=False)  # the Bot Connector signs with a key the cache does not hold
    await channel.handle_callback(*fake.invoke(fake.activity("r3", aad=ALICE)), handler)
    assert fake.key_fetches == 2
    assert [c.request_id for c in handler.clicks] == ["r1", "r2", "r3"]


async def test_unknown_kids_refetch_the_keys_at_most_once_per_cooldown(fake: FakeBotFramework) -> None:
    channel = TeamsChannel("ops-teams", TeamsConfig.model_validate(fake.config()))
    try:
        handler = RecordingHandler()
        await channel.handle_callback(*fake.invoke(fake.activity("r1", aad=ALICE)), handler)
        for _ in range(5):
            token = fake.sign(fake.claims(), kid="made-up", key=fake.keys[fake.kid])
            with pytest.raises(CallbackRejected, match="unknown key"):
                await channel.handle_callback(
                    *fake.invoke(fake.activity("r2", aad=ALICE), token=token), handler
                )
        assert fake.key_fetches == 1  # no fetch per forged kid
    finally:
        await channel.aclose()


async def test_signing_keys_unavailable_refuses_with_503(fake: FakeBotFramework) -> None:
    config = TeamsConfig.model_validate(fake.config(openid_metadata_url=f"{fake.origin}/missing"))
    channel = TeamsChannel("ops-teams", config)
    try:
        handler = RecordingHandler()
        with pytest.raises(CallbackRejected) as refused:
            await channel.handle_callback(*fake.invoke(fake.activity("r1", aad=ALICE)), handler)
        assert refused.value.status_code == 503
        assert handler.clicks == []
    finally:
        await channel.aclose()


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ("another tenant", 403),
        ("no aadObjectId", 400),
        ("unknown verb", 400),
        ("no request", 400),
        ("Action.Submit", 400),
    ],
)
async def test_verified_invokes_that_are_not_our_clicks_are_refused(
    fake: FakeBotFramework, channel: TeamsChannel, change: str, status: int
) -> None:
    handler = RecordingHandler()
    activity = fake.activity("req-1", "approve", aad=ALICE)
    if change == "another tenant":
        activity["conversation"]["tenantId"] = "11111111-1111-1111-1111-111111111111"
    elif change == "no aadObjectId":
        del activity["from"]["aadObjectId"]
    elif change == "unknown verb":
        activity["value"]["action"]["verb"] = "approve_all"
    elif change == "no request":
        del activity["value"]["action"]["data"]["request_id"]
    elif change == "Action.Submit":
        activity["value"]["action"]["type"] = "Action.Submit"
    with pytest.raises(CallbackRejected) as refused:
        await channel.handle_callback(*fake.invoke(activity), handler)
    assert refused.value.status_code == status
    assert handler.clicks == []


async def test_other_verified_activities_are_acknowledged_and_not_applied(
    fake: FakeBotFramework, channel: TeamsChannel
) -> None:
    handler = RecordingHandler()
    activity = fake.activity("req-1", aad=ALICE)
    activity.update(type="conversationUpdate", name=None)
    reply = await channel.handle_callback(*fake.invoke(activity), handler)
    assert reply.body == {}
    assert handler.clicks == []


async def test_a_replayed_invoke_is_applied_once(fake: FakeBotFramework, channel: TeamsChannel) -> None:
    handler = RecordingHandler()
    request = fake.invoke(fake.activity("req-1", "approve", aad=ALICE, activity_id="f:42"))
    first = await channel.handle_callback(*request, handler)
    again = await channel.handle_callback(*request, handler)
    assert len(handler.clicks) == 1
    assert again.body == first.body
    assert again.after is None  # no second look-up either


# What a click carries


async def test_reason_grant_and_edits_come_from_the_merged_inputs(
    fake: FakeBotFramework, channel: TeamsChannel
) -> None:
    handler = RecordingHandler()
    grant = GrantChoice("session", 3600, ("to",))
    reject = fake.activity("r1", "reject", aad=ALICE, data={"reason": "  wrong payee  ", "grant": "once"})
    await channel.handle_callback(*fake.invoke(reject), handler)
    approve = fake.activity("r2", "approve", aad=ALICE, data={"grant": json.dumps(grant.as_dict())})
    await channel.handle_callback(*fake.invoke(approve), handler)
    edit = fake.activity(
        "r3",
        "approve",
        aad=ALICE,
        data={"edit": [["amount", "json"], ["memo", "text"]], "edit_0": "40000", "edit_1": "007"},
    )
    await channel.handle_callback(*fake.invoke(edit), handler)
    rejected, granted, edited = handler.clicks
    assert (rejected.verdict, rejected.reason, rejected.grant) == ("reject", "wrong payee", None)
    assert granted.grant == grant
    assert edited.arguments == {"amount": 40000, "memo": "007"}
    assert edited.grant is None


async def test_an_edit_that_cannot_be_approved_answers_the_card_with_why(
    fake: FakeBotFramework, channel: TeamsChannel
) -> None:
    handler = RecordingHandler()

    async def current_card(channel: str, request_id: str) -> Any:
        return make_card(request_id=request_id)

    handler.current_card = current_card  # type: ignore[attr-defined]
    edit = fake.activity("r3", "approve", aad=ALICE, data={"edit": [["memo", "text"]], "edit_0": "x" * 5000})
    reply = await channel.handle_callback(*fake.invoke(edit), handler)
    assert handler.clicks == []
    assert reply.body is not None
    assert "bytes" in json.dumps(reply.body["value"])
    assert len(executes(reply.body["value"])) >= 2  # still pending: the card keeps its actions


# Cards


def texts(card: dict[str, Any]) -> str:
    return json.dumps(card, ensure_ascii=False)


def test_a_pending_card_has_approve_reject_grants_and_edits() -> None:
    grant = GrantChoice("agent", 3600)
    card = render_card(make_card(grants=(grant,), editable=("amount",), require_reject_reason=True))
    verbs = sorted(a["verb"] for a in executes(card))
    assert verbs == ["approve", "approve", "reject"]
    assert all(a["data"]["request_id"] == "req-1" for a in executes(card))
    assert card["version"] == "1.4"
    [choice] = [e for e in card["body"] if e["type"] == "Input.ChoiceSet"]
    assert choice["choices"][0]["value"] == "once"
    assert GrantChoice.from_dict(json.loads(choice["choices"][1]["value"])) == grant
    reject = next(a for a in card["actions"] if a["title"] == "Reject…")
    assert reject["card"]["body"][0]["isRequired"] is True


def test_agent_text_never_reaches_markdown() -> None:
    card = render_card(
        make_card(tool_name="[click](https://evil.example)", arguments={"**x**": "<at>all</at>"})
    )
    text_blocks = [e["text"] for e in card["body"] if e["type"] == "TextBlock"]
    assert not any("evil" in t or "**x**" in t for t in text_blocks)
    assert "evil.example" in texts(card)  # shown, as plain text runs


def test_a_decided_card_has_no_actions_and_says_who() -> None:
    card = render_card(
        decided(make_card(console_url="https://signoff.example/ui/requests/req-1"), "rejected", reason="no")
    )
    assert executes(card) == []
    assert [a["type"] for a in card["actions"]] == ["Action.OpenUrl"]
    assert "Decided by: Alice" in texts(card)
    assert "Reason: no" in texts(card)


def test_a_call_too_big_to_show_offers_no_approval() -> None:
    arguments = {f"field_{i}": "v" * 3000 for i in range(400)}
    card = render_card(make_card(arguments=arguments))
    assert [a["verb"] for a in executes(card)] == ["reject"]
    assert len(json.dumps(card).encode()) < 28 * 1024


def test_reminders_mention_by_object_id_and_escape_agent_text() -> None:
    reminder = render_reminder(
        make_card(tool_name="<at>everyone</at>"), (Person("Alice", ALICE), Person("Bob (no Teams id)"))
    )
    assert reminder["entities"] == [
        {"type": "mention", "text": "<at>Alice</at>", "mentioned": {"id": ALICE, "name": "Alice"}}
    ]
    assert "&lt;at&gt;everyone" in reminder["text"]
    assert reminder["text"].count("<at>") == 1


# Delivery


async def test_post_update_and_remind_through_the_connector_with_one_token(
    fake: FakeBotFramework, channel: TeamsChannel
) -> None:
    ref = await channel.post(make_card())
    assert ref["conversation"] == CONVERSATION
    await channel.update(ref, decided(make_card()))
    await channel.remind(ref, make_card(), (Person("Alice", ALICE),), key="k1")
    assert executes(fake.card(ref["activity_id"])) == []
    [(thread, reply)] = fake.replies
    assert thread == ref["activity_id"]
    assert reply["replyToId"] == ref["activity_id"]
    assert channel.token.fetches == 1


async def test_rate_limits_and_outages_are_retryable_with_retry_after(
    fake: FakeBotFramework, channel: TeamsChannel
) -> None:
    fake.fail_next("post", Scripted(429, {"Retry-After": "7"}))
    with pytest.raises(RetryableDeliveryError) as limited:
        await channel.post(make_card())
    assert limited.value.retry_after == 7.0
    fake.fail_next("post", Scripted(502, html=True))
    with pytest.raises(RetryableDeliveryError):
        await channel.post(make_card())
    fake.fail_next("token", Scripted(503))
    channel.token.forget(next(iter(fake.tokens)))
    with pytest.raises(RetryableDeliveryError):
        await channel.post(make_card())
    assert (await channel.post(make_card()))["activity_id"]


async def test_a_refused_token_is_asked_for_again(fake: FakeBotFramework, channel: TeamsChannel) -> None:
    await channel.post(make_card())
    fake.tokens.clear()  # revoked
    with pytest.raises(RetryableDeliveryError, match="401"):
        await channel.post(make_card())
    await channel.post(make_card())
    assert channel.token.fetches == 2


async def test_wrong_credentials_and_unknown_conversations_are_permanent(fake: FakeBotFramework) -> None:
    bad = TeamsChannel("t", TeamsConfig.model_validate(fake.config(app_password="wrong")))
    try:
        with pytest.raises(PermanentDeliveryError, match=r"invalid_client.*AADSTS7000215"):
            await bad.post(make_card())
    finally:
        await bad.aclose()
    lost = TeamsChannel("t", TeamsConfig.model_validate(fake.config(conversation_id="19:gone@thread.tacv2")))
    try:
        with pytest.raises(PermanentDeliveryError, match="404 ConversationNotFound"):
            await lost.post(make_card())
        with pytest.raises(PermanentDeliveryError, match="ActivityNotFound"):
            await lost.update({"conversation": CONVERSATION, "activity_id": "1"}, make_card())
    finally:
        await lost.aclose()


async def test_lookup_user_reads_the_member(fake: FakeBotFramework, channel: TeamsChannel) -> None:
    fake.members[ALICE] = {
        "id": "29:1abc",
        "name": "Alice Liu",
        "aadObjectId": ALICE,
        "email": "alice@example.com",
    }
    assert await channel.lookup_user(ALICE) == ("Alice Liu", "alice@example.com")
    with pytest.raises(PermanentDeliveryError):
        await channel.lookup_user("0b0b0000-0000-4000-8000-000000000002")


# Configuration


def test_config_check_knows_the_type_and_says_what_is_wrong() -> None:
    base = {
        "type": "teams",
        "app_id": APP_ID,
        "app_password": "s",
        "tenant_id": TENANT,
        "conversation_id": CONVERSATION,
    }
    raw = {
        "channels": {"ops-teams": base},
        "people": {"alice": {"name": "Alice", "teams": ALICE}, "bob": {"name": "Bob"}},
        "agents": {
            "a": {
                "hooks": [
                    {
                        "type": "confirmation_gate",
                        "tools": ["x"],
                        "channel": "ops-teams",
                        "approvers": ["alice"],
                    }
                ]
            }
        },
    }
    config = parse_config(raw)
    assert config.person_for("teams", ALICE.upper()) == "alice"
    bad = json.loads(json.dumps(raw))
    bad["channels"]["ops-teams"].update(app_id="my-bot", service_url="http://smba.example/teams/")
    bad["agents"]["a"]["hooks"][0]["approvers"] = ["bob"]
    with pytest.raises(ConfigError) as error:
        parse_config(bad, source="s.yaml")
    text = str(error.value)
    assert "channels.ops-teams.app_id: must be a GUID" in text
    assert "channels.ops-teams.service_url: must use https" in text
    bad["channels"]["ops-teams"] = base
    with pytest.raises(ConfigError, match="'bob' has no teams id in people; add `teams: <user id>`"):
        parse_config(bad, source="s.yaml")


def test_the_config_and_cards_import_without_pyjwt() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = """
import sys
sys.modules["jwt"] = None  # what an install without the teams extra looks like
import signoff.channels.teams as teams
config = teams.TeamsConfig.model_validate(CONFIG)
teams.render_card  # the pure functions are usable too
try:
    teams.create("ops", config)
except ImportError as exc:
    print(exc)
""".replace(
        "CONFIG",
        repr(
            {
                "type": "teams",
                "app_id": APP_ID,
                "app_password": "s",
                "tenant_id": TENANT,
                "conversation_id": "19:a@thread.v2",
            }
        ),
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "pip install 'signoff[teams]'" in result.stdout


async def test_a_slow_click_is_answered_in_time_and_a_failed_one_says_so(fake: FakeBotFramework) -> None:
    channel = TeamsChannel("ops-teams", TeamsConfig.model_validate(fake.config()), reply_budget=0.05)
    try:
        slow = RecordingHandler(delay=0.5)
        reply = await channel.handle_callback(*fake.invoke(fake.activity("r1", aad=ALICE)), slow)
        assert reply.body == {
            "statusCode": 200,
            "type": "application/vnd.microsoft.activity.message",
            "value": RECORDING,
        }
        broken = RecordingHandler(error=RuntimeError("database down"))
        reply = await channel.handle_callback(*fake.invoke(fake.activity("r2", aad=ALICE)), broken)
        assert reply.body is not None
        assert reply.body["value"] == NOT_RECORDED
        # A replay of the failed invoke tries again rather than repeating the failure.
        fixed = RecordingHandler()
        again = fake.invoke(fake.activity("r3", aad=ALICE, activity_id="f:7"))
        await channel.handle_callback(*again, broken)
        await channel.handle_callback(*again, fixed)
        assert len(fixed.clicks) == 1
    finally:
        await channel.aclose()
