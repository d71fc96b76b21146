"""Receipts the server signed, presented for what they do not say.

Real receipts come from the HTTP API (a call approved and reported run with other
arguments, a call rejected); the checks are the verifier's own (``verify_receipt``,
``signoff-verify``, ``signoff receipts verify``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from signoff.app.config import SignoffConfig
from signoff.app.evidence import verify_all
from signoff.hooks.receipts import ReceiptInvalid, main, verify_receipt
from tests.cli import signoff
from tests.redteam.support import POST, agent, attack_config, decide, pending, property_test, send

AGENT = "finance-bot"


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


def _call(
    config: SignoffConfig, sent: dict[str, Any], arguments: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "agent": AGENT,
        "tool": sent["tool_name"],
        "arguments": sent["arguments"] if arguments is None else arguments,
        "session": sent.get("session_id"),
        "policy_version": config.version,
    }


async def _record(http: httpx.AsyncClient, key: str, rid: str) -> dict[str, Any]:
    r = await http.get(f"/v1/requests/{rid}", headers=agent(key))
    assert r.status_code == 200, r.text
    record: dict[str, Any] = r.json()
    return record


async def _keys(http: httpx.AsyncClient) -> dict[str, Any]:
    published: dict[str, Any] = (await http.get("/v1/receipts/keys")).json()
    return published


async def test_an_execution_receipt_of_a_call_run_otherwise_is_no_cover_for_that_call(
    http: httpx.AsyncClient, agent_key: str, config: SignoffConfig
) -> None:
    """Approved: 1,500 to acme. Run and reported: 900,000. The execution receipt the server
    signs for the report (``executed_mismatch``) must not pass as covering the 900,000 call
    when checked against it: "this call is covered" would then say so of a call nobody approved."""
    sent = send(1500)
    rid = await pending(http, agent_key, sent)
    assert (await decide(http, rid)).status_code == 200
    ran = {**sent["arguments"], "amount": 900_000}
    report = await http.post(POST, json={**sent, "arguments": ran, "result": "ok"}, headers=agent(agent_key))
    execution = report.json()["receipt"]
    keys = await _keys(http)
    assert verify_receipt(execution, keys)["executed_mismatch"] is True
    with pytest.raises(ReceiptInvalid, match="otherwise than approved"):
        verify_receipt(execution, keys, call=_call(config, sent, ran))
    decision = (await _record(http, agent_key, rid))["receipt"]
    with pytest.raises(ReceiptInvalid, match="approve this call"):
        verify_receipt(decision, keys, call=_call(config, sent, ran))
    verify_receipt(decision, keys, call=_call(config, sent))  # what was approved is covered


async def test_a_rejection_covers_no_call(
    http: httpx.AsyncClient, agent_key: str, config: SignoffConfig
) -> None:
    sent = send(2500)
    rid = await pending(http, agent_key, sent)
    assert (await decide(http, rid, verdict="reject")).status_code == 200
    receipt = (await _record(http, agent_key, rid))["receipt"]
    keys = await _keys(http)
    assert verify_receipt(receipt, keys)["verdict"] == "rejected"
    with pytest.raises(ReceiptInvalid):
        verify_receipt(receipt, keys, call=_call(config, sent))


def _with_duplicate(text: str, name: str, value: Any) -> str:
    """``text`` (a receipt's JSON) with ``"name": value`` written once more, before the signed one."""
    signed = f'"{name}":'
    at = text.index(signed)
    return text[:at] + f"{json.dumps(name)}:{json.dumps(value)}," + text[at:]


async def test_a_receipt_file_with_a_repeated_key_is_refused(
    http: httpx.AsyncClient, agent_key: str, tmp_path: Path
) -> None:
    """A rejection with a second ``"verdict": "approved"`` written before the signed one reads
    as approved to a reader that keeps the first of repeated keys, and verified (Python keeps
    the last). What two readers can read differently is not a valid receipt."""
    rid = await pending(http, agent_key, send(2500))
    assert (await decide(http, rid, verdict="reject")).status_code == 200
    receipt = (await _record(http, agent_key, rid))["receipt"]
    text = _with_duplicate(json.dumps(receipt, separators=(",", ":")), "verdict", "approved")
    assert text.index('"verdict":"approved"') < text.index('"verdict":"rejected"')
    path, keys = tmp_path / "receipt.json", tmp_path / "keys.json"
    path.write_text(text)
    keys.write_text(json.dumps(await _keys(http)))
    assert main([str(path), "--keys", str(keys)]) == 2
    pack = tmp_path / "pack.json"
    pack.write_text('{"receipts": [{"request_id": ' + json.dumps(rid) + ', "receipt": ' + text + "}]}")
    env = {"PATH": "/usr/bin:/bin"}
    done = await asyncio.to_thread(signoff, "receipts", "verify", str(pack), "--keys", str(keys), env=env)
    assert done.returncode == 1, done.stdout
    assert "repeat" in done.stderr


SIGNATURE_SPELLINGS = st.sampled_from(["pad", "plus", "junk", "space"])


@property_test(20)
@given(how=SIGNATURE_SPELLINGS)
async def test_a_signature_is_read_only_as_unpadded_base64url(
    http: httpx.AsyncClient, agent_key: str, how: str
) -> None:
    """The same signature spelt otherwise (padding, ``+``/``/``, stray characters) makes another
    receipt (another ``decision_receipt`` digest) that would verify as well."""
    rid = await pending(http, agent_key, send(2500))
    assert (await decide(http, rid)).status_code == 200
    receipt = (await _record(http, agent_key, rid))["receipt"]
    sig = receipt["signature"]
    spelt = {
        "pad": sig + "==",
        "plus": sig.replace("-", "+").replace("_", "/") if ("-" in sig or "_" in sig) else sig + "!",
        "junk": sig[:10] + "!*" + sig[10:],
        "space": sig[:10] + " " + sig[10:],
    }[how]
    with pytest.raises(ReceiptInvalid, match="base64url"):
        verify_receipt({**receipt, "signature": spelt}, await _keys(http))


async def test_a_pack_record_holds_the_receipts_of_its_own_request(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    """Each receipt is validly signed; a pack that files them under other requests, swaps a
    decision and an execution receipt, or chains an execution to another decision is not."""
    records = []
    for amount in (1500, 2500):
        sent = send(amount)
        rid = await pending(http, agent_key, sent)
        assert (await decide(http, rid)).status_code == 200
        await http.post(POST, json={**sent, "result": "ok"}, headers=agent(agent_key))
        rec = await _record(http, agent_key, rid)
        records.append(
            {"request_id": rid, "receipt": rec["receipt"], "execution_receipt": rec["execution_receipt"]}
        )
    keys = await _keys(http)
    (a, b) = records
    assert verify_all({"keys": keys["keys"], "receipts": records}, keys) == (4, [])
    forged = {
        "other request's receipt": {**a, "receipt": b["receipt"]},
        "other request's execution": {**a, "execution_receipt": b["execution_receipt"]},
        "swapped kinds": {**a, "receipt": a["execution_receipt"], "execution_receipt": a["receipt"]},
    }
    for name, record in forged.items():
        _, problems = verify_all({"keys": keys["keys"], "receipts": [record]}, keys)
        assert problems, name
        assert all(a["request_id"] in p for p in problems), problems


async def test_a_pack_forged_with_its_own_key_says_whose_keys_vouched(
    http: httpx.AsyncClient, agent_key: str, tmp_path: Path
) -> None:
    """Anyone can sign a pack with a key of their own and ship the key in it: checked with
    the pack's keys it verifies, so the answer must say the keys are the pack's (to compare
    with the server's); with the server's keys it is refused."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from signoff.app.receipt_keys import SigningKey, sign

    rid = await pending(http, agent_key, send(2500))
    assert (await decide(http, rid, verdict="reject")).status_code == 200
    real = (await _record(http, agent_key, rid))["receipt"]
    mine = SigningKey(Ed25519PrivateKey.generate())
    forged = sign({**real["payload"], "verdict": "approved"}, mine)
    jwk = {"kid": mine.kid, "kty": "OKP", "crv": "Ed25519", "x": mine.x}
    pack, keys = tmp_path / "pack.json", tmp_path / "keys.json"
    pack.write_text(json.dumps({"keys": [jwk], "receipts": [{"request_id": rid, "receipt": forged}]}))
    keys.write_text(json.dumps(await _keys(http)))
    env = {"PATH": "/usr/bin:/bin"}
    said = await asyncio.to_thread(signoff, "receipts", "verify", str(pack), env=env)
    assert said.returncode == 0, said.stderr
    assert f"under the pack's own keys ({mine.kid})" in said.stdout
    refused = await asyncio.to_thread(signoff, "receipts", "verify", str(pack), "--keys", str(keys), env=env)
    assert refused.returncode == 1
    assert "not among the published keys" in refused.stderr


def _confused(receipt: dict[str, Any], keys: dict[str, Any], how: str) -> tuple[dict[str, Any], Any]:
    """The receipt and keys rewritten for one algorithm-confusion attempt."""
    (key,) = [k for k in keys["keys"] if k["kid"] == receipt["key_id"]]
    if how == "alg none":
        return {**receipt, "signature": ""}, keys
    if how == "alg in the receipt":
        return {**receipt, "alg": "none"}, keys
    if how == "HS256 with the public key":
        import base64
        import hashlib
        import hmac

        from signoff.hooks.receipts import canonical_bytes

        secret = base64.urlsafe_b64decode(key["x"] + "==")
        mac = hmac.new(secret, canonical_bytes(receipt["payload"]), hashlib.sha256).digest()
        oct_key = {**key, "kty": "oct", "k": key["x"], "alg": "HS256"}
        sig = base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
        return {**receipt, "signature": sig}, {"keys": [oct_key]}
    if how == "another curve":
        return receipt, {"keys": [{**key, "crv": "X25519"}]}
    if how == "truncated signature":
        return {**receipt, "signature": receipt["signature"][:43]}, keys
    assert how == "expired key"
    return receipt, {"keys": [{**key, "not_after": "2000-01-01T00:00:00+00:00"}]}


@pytest.mark.parametrize(
    "how",
    [
        "alg none",
        "alg in the receipt",
        "HS256 with the public key",
        "another curve",
        "truncated signature",
        "expired key",
    ],
)
async def test_algorithm_confusion_and_cut_signatures_are_refused(
    http: httpx.AsyncClient, agent_key: str, how: str
) -> None:
    rid = await pending(http, agent_key, send(2500))
    assert (await decide(http, rid)).status_code == 200
    receipt = (await _record(http, agent_key, rid))["receipt"]
    keys = await _keys(http)
    verify_receipt(receipt, keys)
    forged, their_keys = _confused(receipt, keys, how)
    with pytest.raises(ReceiptInvalid):
        verify_receipt(forged, their_keys)


async def test_a_receipt_respelt_verifies_as_the_same_receipt(
    http: httpx.AsyncClient, agent_key: str, tmp_path: Path
) -> None:
    """The signature binds what the JSON says, not how it is spelt: keys in another order,
    every character escaped, 1 written 1.0 still verify, and say the same (a change of what
    it says, such as 1 to 2, does not)."""
    rid = await pending(http, agent_key, send(2500))
    assert (await decide(http, rid, verdict="reject")).status_code == 200
    receipt = (await _record(http, agent_key, rid))["receipt"]
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps(await _keys(http)))
    payload = dict(reversed(list(receipt["payload"].items())))
    text = json.dumps({"signature": receipt["signature"], "key_id": receipt["key_id"], "payload": payload})
    text = text.replace('"version": 1', '"version": 1.0').replace('"rejected"', '"\\u0072ejected"')
    assert '"version": 1.0' in text
    assert "\\u0072ejected" in text
    path = tmp_path / "respelt.json"
    path.write_text(text)
    assert main([str(path), "--keys", str(keys)]) == 0
    path.write_text(text.replace('"version": 1.0', '"version": 2'))
    assert main([str(path), "--keys", str(keys)]) == 1
