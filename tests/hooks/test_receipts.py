"""Receipts checked offline (signoff.hooks.receipts): the action digest against RFC 8785's own
vectors and an independent JCS implementation, signatures refused for any change, keys refused
outside their window, and the ``signoff-verify`` command."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import jcs
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from signoff.app.receipt_keys import SigningKey, parse_key, sign
from signoff.hooks.receipts import (
    ReceiptInvalid,
    action_digest,
    canonical_bytes,
    jwk_thumbprint,
    receipt_digest,
    verify_receipt,
)

# RFC 8785 section 3.2.2: the sample input and its canonical form.
RFC_SAMPLE = (
    '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
    ' "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
    ' "literals": [null, true, false]}'
)
RFC_SAMPLE_CANONICAL = (
    '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
    '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
)
# RFC 8785 section 3.2.3: keys sorted by their UTF-16 code units.
RFC_SORTING = {
    "\u20ac": "Euro Sign",
    "\r": "Carriage Return",
    "\ufb33": "Hebrew Letter Dalet With Dagesh",
    "1": "One",
    "\U0001f600": "Emoji: Grinning Face",
    "\u0080": "Control",
    "\u00f6": "Latin Small Letter O With Diaeresis",
}
RFC_SORTED_KEYS = ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
# RFC 8785 appendix B: IEEE 754 doubles (as bits) and their serialization.
RFC_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]

CALL: dict[str, Any] = {
    "agent": "finance-bot",
    "tool": "pay_invoice",
    "arguments": {"amount": 90000, "to": "ACME GmbH", "memo": "Rechnung Nº 7 — €", "lines": [1, 2.5, None]},
    "session": "s-1",
    "policy_version": "3f2a9c",
}


def test_the_rfc_sample_serializes_as_the_rfc_says() -> None:
    value = json.loads(RFC_SAMPLE)
    assert canonical_bytes(value).decode() == RFC_SAMPLE_CANONICAL
    assert jcs.canonicalize(value).decode() == RFC_SAMPLE_CANONICAL


def test_keys_sort_by_utf16_code_units_as_the_rfc_says() -> None:
    assert list(json.loads(canonical_bytes(RFC_SORTING))) == RFC_SORTED_KEYS


@pytest.mark.parametrize(("bits", "text"), RFC_NUMBERS)
def test_numbers_serialize_as_the_rfc_appendix_says(bits: str, text: str) -> None:
    (number,) = struct.unpack(">d", bytes.fromhex(bits))
    assert canonical_bytes(number).decode() == text


def test_the_action_digest_is_sha256_over_an_independent_jcs_of_the_call() -> None:
    expected = hashlib.sha256(jcs.canonicalize(CALL)).hexdigest()
    assert action_digest(**CALL) == expected
    # Pinned: another system computing the digest of this call must arrive here.
    assert expected == hashlib.sha256(canonical_bytes(CALL)).hexdigest()


def test_a_call_without_a_session_digests_with_session_null() -> None:
    call = {**CALL, "session": None}
    assert action_digest(**call) == hashlib.sha256(jcs.canonicalize(call)).hexdigest()
    assert b'"session":null' in canonical_bytes(call)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(arguments=st.dictionaries(st.text(), json_values, max_size=5), session=st.none() | st.text())
def test_the_digest_matches_the_independent_jcs_for_any_call(
    arguments: dict[str, Any], session: str | None
) -> None:
    call = {**CALL, "arguments": arguments, "session": session}
    assert action_digest(**call) == hashlib.sha256(jcs.canonicalize(call)).hexdigest()


def test_what_jcs_cannot_represent_is_refused() -> None:
    with pytest.raises(ValueError, match="RFC 8785"):
        action_digest(**{**CALL, "arguments": {"n": 2**64}})
    with pytest.raises(ValueError, match="RFC 8785"):
        canonical_bytes(float("inf"))


# --- signing and verifying -------------------------------------------------------------------


def _key() -> SigningKey:
    return SigningKey(Ed25519PrivateKey.generate())


def _jwk(key: SigningKey, not_before: str | None = None, not_after: str | None = None) -> dict[str, Any]:
    return {
        "kid": key.kid,
        "kty": "OKP",
        "crv": "Ed25519",
        "x": key.x,
        "not_before": not_before,
        "not_after": not_after,
    }


PAYLOAD: dict[str, Any] = {
    "kind": "decision",
    "version": 1,
    "request_id": "0af3",
    "verdict": "approved",
    "action_digest": "a" * 64,
    "approved_digest": "a" * 64,
    "votes": [{"person": "alice", "verdict": "approve", "channel": "web", "assurance": None}],
    "policy_version": "3f2a9c",
    "issued_at": "2026-12-02T18:00:00+00:00",
}


def test_a_signed_receipt_verifies_with_only_the_published_keys() -> None:
    key = _key()
    receipt = sign(PAYLOAD, key)
    published = json.loads(json.dumps({"keys": [_jwk(key)]}))  # as it travels
    assert verify_receipt(json.loads(json.dumps(receipt)), published) == PAYLOAD
    assert receipt["key_id"] == jwk_thumbprint(key.x)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _paths(v, (*prefix, k))] or [prefix]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _paths(v, (*prefix, i))] or [prefix]
    return [prefix]


def _set(value: Any, path: tuple[Any, ...], new: Any) -> None:
    for step in path[:-1]:
        value = value[step]
    value[path[-1]] = new


SIGNED_KEY = _key()
SIGNED = sign(PAYLOAD, SIGNED_KEY)
LEAVES = _paths(PAYLOAD)


@settings(max_examples=200, deadline=None)
@given(path=st.sampled_from(LEAVES), new=json_values)
def test_any_changed_payload_field_is_refused(path: tuple[Any, ...], new: Any) -> None:
    tampered = copy.deepcopy(SIGNED)
    old = copy.deepcopy(tampered["payload"])
    _set(tampered["payload"], path, new)
    if canonical_bytes(tampered["payload"]) == canonical_bytes(old):
        return  # the same value (1 and 1.0 are one JSON number): nothing changed
    with pytest.raises(ReceiptInvalid):
        verify_receipt(tampered, {"keys": [_jwk(SIGNED_KEY)]})


@settings(max_examples=100, deadline=None)
@given(name=st.text(min_size=1), value=json_values)
def test_an_added_payload_field_is_refused(name: str, value: Any) -> None:
    tampered = copy.deepcopy(SIGNED)
    if name in tampered["payload"]:
        return
    tampered["payload"][name] = value
    with pytest.raises(ReceiptInvalid):
        verify_receipt(tampered, {"keys": [_jwk(SIGNED_KEY)]})


@settings(max_examples=200, deadline=None)
@given(index=st.integers(min_value=0, max_value=63), bit=st.integers(min_value=0, max_value=7))
def test_any_changed_signature_bit_is_refused(index: int, bit: int) -> None:
    raw = bytearray(base64.urlsafe_b64decode(SIGNED["signature"] + "=="))
    raw[index] ^= 1 << bit
    tampered = {**SIGNED, "signature": base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()}
    with pytest.raises(ReceiptInvalid, match="signature"):
        verify_receipt(tampered, {"keys": [_jwk(SIGNED_KEY)]})


@settings(max_examples=100, deadline=None)
@given(kid=st.text())
def test_any_other_key_id_is_refused(kid: str) -> None:
    if kid == SIGNED["key_id"]:
        return
    with pytest.raises(ReceiptInvalid):
        verify_receipt({**SIGNED, "key_id": kid}, {"keys": [_jwk(SIGNED_KEY)]})


def test_another_key_is_refused_even_under_the_right_key_id() -> None:
    other = _jwk(_key())
    with pytest.raises(ReceiptInvalid, match="not among"):
        verify_receipt(SIGNED, {"keys": [other]})
    # A key set that swaps the public key under the receipt's id is caught by the thumbprint.
    with pytest.raises(ReceiptInvalid, match="thumbprint"):
        verify_receipt(SIGNED, {"keys": [{**other, "kid": SIGNED["key_id"]}]})


def test_a_rotated_out_key_verifies_what_it_signed_before_and_nothing_after() -> None:
    old = _key()
    keys = {"keys": [_jwk(old, "2026-12-01T00:00:00+00:00", "2026-12-02T12:00:00+00:00")]}
    before = sign({**PAYLOAD, "issued_at": "2026-12-02T11:59:59+00:00"}, old)
    after = sign({**PAYLOAD, "issued_at": "2026-12-02T12:00:01+00:00"}, old)
    early = sign({**PAYLOAD, "issued_at": "2026-11-30T00:00:00+00:00"}, old)
    assert verify_receipt(before, keys)["issued_at"] == "2026-12-02T11:59:59+00:00"
    with pytest.raises(ReceiptInvalid, match="rotated out"):
        verify_receipt(after, keys)
    with pytest.raises(ReceiptInvalid, match="before key"):
        verify_receipt(early, keys)


@pytest.mark.parametrize(
    "broken",
    [
        {},
        {"payload": PAYLOAD},
        {**SIGNED, "extra": 1},
        {**SIGNED, "payload": "text"},
        {**SIGNED, "signature": ""},
        {**SIGNED, "signature": "***"},
        {**SIGNED, "payload": {k: v for k, v in PAYLOAD.items() if k != "issued_at"}},
    ],
)
def test_malformed_receipts_are_refused_naming_the_problem(broken: dict[str, Any]) -> None:
    with pytest.raises(ReceiptInvalid):
        verify_receipt(broken, {"keys": [_jwk(SIGNED_KEY)]})


def test_the_receipt_digest_names_the_whole_receipt() -> None:
    assert receipt_digest(SIGNED) == hashlib.sha256(jcs.canonicalize(SIGNED)).hexdigest()
    assert receipt_digest({**SIGNED, "key_id": "x"}) != receipt_digest(SIGNED)


def test_an_operator_key_is_read_as_base64url_or_pem() -> None:
    from cryptography.hazmat.primitives import serialization

    private = Ed25519PrivateKey.generate()
    raw = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    from_raw = parse_key(base64.urlsafe_b64encode(raw).rstrip(b"=").decode())
    assert parse_key(pem).kid == from_raw.kid
    with pytest.raises(ValueError, match="32"):
        parse_key(base64.urlsafe_b64encode(b"short").decode())


# --- the command ---------------------------------------------------------------------------------


def _verify(tmp_path: Path, receipt: Any, keys: Any) -> subprocess.CompletedProcess[str]:
    (tmp_path / "receipt.json").write_text(json.dumps(receipt))
    (tmp_path / "keys.json").write_text(json.dumps(keys))
    script = Path(sys.executable).parent / "signoff-verify"
    return subprocess.run(
        [str(script), str(tmp_path / "receipt.json"), "--keys", str(tmp_path / "keys.json")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_signoff_verify_exits_0_only_for_a_valid_receipt(tmp_path: Path) -> None:
    keys = {"keys": [_jwk(SIGNED_KEY)]}
    ok = _verify(tmp_path, SIGNED, keys)
    assert ok.returncode == 0, ok.stderr
    assert "valid decision receipt for request 0af3: approved" in ok.stdout
    # A request record carrying the receipt verifies too.
    assert _verify(tmp_path, {"id": "0af3", "receipt": SIGNED}, keys).returncode == 0
    bad = _verify(tmp_path, {**SIGNED, "payload": {**PAYLOAD, "verdict": "rejected"}}, keys)
    assert bad.returncode == 1
    assert "invalid receipt: the signature does not match" in bad.stderr
    (tmp_path / "receipt.json").write_text("{not json")
    unreadable = subprocess.run(
        [str(Path(sys.executable).parent / "signoff-verify"), str(tmp_path / "receipt.json"), "--keys", "x"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert unreadable.returncode == 2
    assert "cannot read" in unreadable.stderr


# --- a receipt for one call is no receipt for another --------------------------------------------

CALL_RECEIPT = sign({**PAYLOAD, "approved_digest": action_digest(**CALL)}, SIGNED_KEY)


def test_a_receipt_covers_the_call_it_names() -> None:
    verify_receipt(CALL_RECEIPT, {"keys": [_jwk(SIGNED_KEY)]}, call=CALL)


@settings(max_examples=100, deadline=None)
@given(arguments=st.dictionaries(st.text(), json_values, max_size=4))
def test_a_receipt_for_other_arguments_is_refused(arguments: dict[str, Any]) -> None:
    other = {**CALL, "arguments": arguments}
    if canonical_bytes(other) == canonical_bytes(CALL):
        return
    with pytest.raises(ReceiptInvalid, match="does not approve this call"):
        verify_receipt(CALL_RECEIPT, {"keys": [_jwk(SIGNED_KEY)]}, call=other)


@pytest.mark.parametrize(
    "other",
    [
        {**CALL, "tool": "pay_invoice_now"},
        {**CALL, "agent": "other-bot"},
        {**CALL, "session": None},
        {**CALL, "policy_version": "ffff"},
        {**CALL, "arguments": {**CALL["arguments"], "amount": 90000.5}},
    ],
)
def test_a_receipt_for_another_tool_agent_session_or_policy_is_refused(other: dict[str, Any]) -> None:
    with pytest.raises(ReceiptInvalid, match="does not approve this call"):
        verify_receipt(CALL_RECEIPT, {"keys": [_jwk(SIGNED_KEY)]}, call=other)


def test_signoff_verify_checks_the_call_when_given_one(tmp_path: Path) -> None:
    (tmp_path / "call.json").write_text(json.dumps(CALL))
    (tmp_path / "other.json").write_text(json.dumps({**CALL, "tool": "other"}))
    (tmp_path / "receipt.json").write_text(json.dumps(CALL_RECEIPT))
    (tmp_path / "keys.json").write_text(json.dumps({"keys": [_jwk(SIGNED_KEY)]}))
    script = str(Path(sys.executable).parent / "signoff-verify")
    base = [script, str(tmp_path / "receipt.json"), "--keys", str(tmp_path / "keys.json"), "--call"]
    ok = subprocess.run([*base, str(tmp_path / "call.json")], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*base, str(tmp_path / "other.json")], capture_output=True, text=True, check=False)
    assert bad.returncode == 1
    assert "does not approve this call" in bad.stderr
