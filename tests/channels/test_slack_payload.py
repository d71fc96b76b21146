"""verify_request, parse_payload and the payload → Click conversions."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest
from starlette.datastructures import Headers

from signoff.channels import CallbackRejected, Click, Verdict
from signoff.channels.slack import (
    MAX_BODY_BYTES,
    click_from_block_actions,
    click_from_view_submission,
    parse_payload,
    verify_request,
)
from tests.channels.slack_support import (
    NOW,
    SECRET,
    approve_payload,
    fixture,
    form_body,
    reject_payload,
    signed,
    submission_payload,
)

VECTOR = fixture("signature_test_vector_slack_docs.json")
VECTOR_TS = int(VECTOR["headers"]["X-Slack-Request-Timestamp"])


def rejected(
    body: bytes, headers: dict[str, str], *, now: float = NOW, secret: str = SECRET
) -> CallbackRejected:
    with pytest.raises(CallbackRejected) as caught:
        verify_request(body, headers, secret, now)
    return caught.value


# -- verify_request ---------------------------------------------------------------------------


@pytest.mark.parametrize("now", [VECTOR_TS, VECTOR_TS + 300, VECTOR_TS - 300])
def test_docs_vector_verifies_within_five_minutes(now: int) -> None:
    verify_request(VECTOR["body"].encode(), VECTOR["headers"], VECTOR["signing_secret"], now)


@pytest.mark.parametrize("now", [VECTOR_TS + 301, VECTOR_TS - 301])
def test_docs_vector_is_stale_outside_five_minutes(now: int) -> None:
    error = rejected(VECTOR["body"].encode(), VECTOR["headers"], now=now, secret=VECTOR["signing_secret"])

    assert error.status_code == 401
    assert "window" in error.reason


def test_derived_request_verifies_at_its_timestamp() -> None:
    request = fixture("derived/signed_block_actions_request.json")

    verify_request(request["raw_body"].encode(), request["headers"], request["signing_secret"], NOW)


def test_own_signed_request_verifies_with_any_header_case() -> None:
    body = form_body(approve_payload())
    headers = signed(body)

    verify_request(body, headers, SECRET, NOW)
    verify_request(body, {k.lower(): v for k, v in headers.items()}, SECRET, NOW)
    verify_request(body, {k.upper(): v for k, v in headers.items()}, SECRET, NOW)
    verify_request(body, Headers(headers), SECRET, NOW)


def test_tampered_body_is_rejected() -> None:
    body = form_body(approve_payload())
    headers = signed(body)

    error = rejected(body.replace(b"signoff_approve", b"signoff_reject_"), headers)

    assert (error.status_code, error.reason) == (401, "signature mismatch")


def test_other_secret_is_rejected() -> None:
    body = form_body(approve_payload())

    assert rejected(body, signed(body, secret="someone-else")).reason == "signature mismatch"


def test_signature_for_another_timestamp_is_rejected() -> None:
    body = form_body(approve_payload())
    headers = signed(body) | {"X-Slack-Request-Timestamp": str(NOW + 1)}

    assert rejected(body, headers).reason == "signature mismatch"


@pytest.mark.parametrize("missing", ["X-Slack-Request-Timestamp", "X-Slack-Signature"])
def test_missing_header_is_rejected(missing: str) -> None:
    body = form_body(approve_payload())
    headers = {k: v for k, v in signed(body).items() if k != missing}

    assert rejected(body, headers).status_code == 401


@pytest.mark.parametrize(
    "timestamp", ["abc", "1700000000.5", "", " 1700000000", "-1700000000", "1e9", "\uff11\uff17"]
)
def test_non_numeric_timestamp_is_rejected(timestamp: str) -> None:
    body = form_body(approve_payload())
    headers = signed(body) | {"X-Slack-Request-Timestamp": timestamp}

    error = rejected(body, headers)

    assert (error.status_code, error.reason) == (401, "malformed X-Slack-Request-Timestamp")


@pytest.mark.parametrize(
    "signature", ["", "v0=", "v1=" + "0" * 64, "v0=" + "g" * 64, "v0=" + "0" * 63, "v0=é" * 9]
)
def test_malformed_signature_is_rejected(signature: str) -> None:
    body = form_body(approve_payload())
    headers = signed(body) | {"X-Slack-Signature": signature}

    assert rejected(body, headers).status_code == 401


def test_stale_own_request_is_rejected() -> None:
    body = form_body(approve_payload())

    assert "window" in rejected(body, signed(body, timestamp=NOW - 301)).reason


def test_non_utf8_body_is_rejected_even_when_signed() -> None:
    body = b"payload=%7B%7D\xff\xfe"
    # slack-sdk cannot sign bytes that are not UTF-8, so sign them by hand.
    digest = hmac.new(SECRET.encode(), b"v0:%d:" % NOW + body, hashlib.sha256).hexdigest()
    headers = {"X-Slack-Request-Timestamp": str(NOW), "X-Slack-Signature": f"v0={digest}"}

    error = rejected(body, headers)

    assert (error.status_code, error.reason) == (401, "body is not UTF-8")


def test_oversized_body_is_rejected_before_hashing() -> None:
    body = b"payload=" + b"x" * MAX_BODY_BYTES

    error = rejected(body, signed(body))

    assert error.status_code == 413


# -- parse_payload ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "block_actions_slack_docs_message.json",
        "block_actions_slack_docs_home_tab.json",
        "block_actions_bolt_python_message_with_blocks.json",
        "block_actions_bolt_python_enterprise_user.json",
        "view_submission_bolt_python_input_block.json",
        "view_submission_bolt_python_response_urls.json",
    ],
)
def test_form_payload_round_trips(name: str) -> None:
    assert parse_payload(form_body(fixture(name))) == fixture(name)


def test_derived_request_parses_back_to_its_fixture() -> None:
    raw = fixture("derived/signed_block_actions_request.json")["raw_body"].encode()

    assert parse_payload(raw) == fixture("block_actions_slack_docs_message.json")


def test_json_body_is_parsed() -> None:
    body = json.dumps(fixture("url_verification_slack_docs.json")).encode()

    assert parse_payload(body)["challenge"] == fixture("url_verification_slack_docs.json")["challenge"]


def test_ssl_check_form() -> None:
    assert parse_payload(b"ssl_check=1&token=abc") == {"type": "ssl_check"}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"foo=bar",
        b"payload=not-json",
        b"payload=%5B1%2C2%5D",
        b'payload={"no_type":1}',
        b"payload=%7B%7D&payload=%7B%7D",
        b"{not json",
        b"\xff\xfe",
        b"payload=" + b"%5B" * 100_000,
    ],
)
def test_unparseable_body_is_a_400(body: bytes) -> None:
    with pytest.raises(CallbackRejected) as caught:
        parse_payload(body)

    assert caught.value.status_code == 400


# -- conversions ------------------------------------------------------------------------------


def test_approve_click_records_identity() -> None:
    click = click_from_block_actions(approve_payload())

    assert click == Click(
        request_id="req-1",
        verdict=Verdict.APPROVE,
        user_id="W111",
        user_name="primary-owner",
        event_id="1596530385.194939:W111",
        identity={
            "user_id": "W111",
            "username": "primary-owner",
            "team_id": "T111",
            "enterprise_id": "E111",
            "action_ts": "1596530385.194939",
            "channel_id": "C0SIGNOFF",
            "message_ts": "111.222",
        },
        conversation="C0SIGNOFF",
    )


def test_reject_click() -> None:
    click = click_from_block_actions(reject_payload())

    assert click is not None
    assert (click.verdict, click.request_id, click.reason) == (Verdict.REJECT, "req-1", None)


@pytest.mark.parametrize(
    "name",
    [
        "block_actions_slack_docs_message.json",
        "block_actions_slack_docs_home_tab.json",
        "block_actions_bolt_python_message_with_blocks.json",
        "block_actions_bolt_python_enterprise_user.json",
    ],
)
def test_other_apps_buttons_are_not_clicks(name: str) -> None:
    assert click_from_block_actions(fixture(name)) is None


def test_home_tab_click_has_no_channel() -> None:
    payload = fixture("block_actions_slack_docs_home_tab.json")
    payload["actions"][0].update(action_id="signoff_approve", value="req-9")

    click = click_from_block_actions(payload)

    assert click is not None
    assert click.request_id == "req-9"
    assert "channel_id" not in click.identity
    assert click.conversation is None
    assert click.identity["team_id"] == "T9TK3CUKW"


def test_user_without_name_falls_back_to_username_then_none() -> None:
    payload = fixture("block_actions_slack_docs_message.json")
    payload["actions"][0].update(action_id="signoff_approve")
    with_username = click_from_block_actions(payload)
    payload["user"].pop("username")
    bare = click_from_block_actions(payload)

    assert with_username is not None
    assert with_username.user_name == "jtorrance"
    assert bare is not None
    assert bare.user_name is None


def test_org_install_reads_team_from_the_user() -> None:
    payload = approve_payload()
    payload["team"] = None
    payload["enterprise"] = {"id": "E999", "name": "Org"}

    click = click_from_block_actions(payload)

    assert click is not None
    assert (click.identity["team_id"], click.identity["enterprise_id"]) == ("T111", "E999")


@pytest.mark.parametrize(
    "broken",
    [
        {"user": None},
        {"user": {"name": "no id"}},
        {"actions": None},
        {"actions": "nope"},
        {"actions": [{"action_id": "signoff_approve"}]},
        {"actions": [{"action_id": "signoff_approve", "value": ""}]},
        {"actions": [["not", "a", "dict"]]},
    ],
)
def test_malformed_block_actions_are_not_clicks(broken: dict[str, Any]) -> None:
    assert click_from_block_actions(approve_payload() | broken) is None


def test_rejection_submission() -> None:
    click = click_from_view_submission(submission_payload("  too risky  "))

    assert click is not None
    assert (click.verdict, click.request_id, click.reason, click.user_id) == (
        Verdict.REJECT,
        "req-1",
        "too risky",
        "W111",
    )
    assert click.identity["view_id"] == "V111"
    assert click.identity["channel_id"] == "C0SIGNOFF"
    assert click.identity["team_id"] == "T111"


@pytest.mark.parametrize("blank", [None, "", "   \n"])
def test_blank_reason_is_none(blank: str | None) -> None:
    click = click_from_view_submission(submission_payload(blank))

    assert click is not None
    assert click.reason is None


def test_resubmission_with_a_reason_is_a_new_event() -> None:
    first = click_from_view_submission(submission_payload(None))
    second = click_from_view_submission(submission_payload("because"))
    again = click_from_view_submission(submission_payload("because"))

    assert first is not None
    assert second is not None
    assert again is not None
    assert first.event_id != second.event_id
    assert second.event_id == again.event_id


def test_other_views_are_not_rejections() -> None:
    assert click_from_view_submission(fixture("view_submission_bolt_python_input_block.json")) is None
    assert click_from_view_submission(fixture("view_submission_bolt_python_response_urls.json")) is None


@pytest.mark.parametrize("metadata", ["", "not json", "[]", '{"request_id": 5}', '{"other": "x"}'])
def test_bad_private_metadata_is_not_a_rejection(metadata: str) -> None:
    payload = submission_payload("why")
    payload["view"]["private_metadata"] = metadata

    assert click_from_view_submission(payload) is None
