"""Signed receipts: check, without Signoff, that a decision or an executed call is what it says.

Signoff signs a receipt for every decided request (``kind: "decision"``) and for every
approved call reported executed (``kind: "execution"``)::

    {"payload": {...}, "key_id": KID, "signature": BASE64URL}

``signature`` is Ed25519 over the RFC 8785 (JCS) bytes of ``payload``; ``key_id`` names the
key among those Signoff publishes at ``GET /v1/receipts/keys``
(``{"keys": [{"kid", "kty": "OKP", "crv": "Ed25519", "x", ...}]}``, ``x`` base64url without
padding). A key carries ``not_before`` and, once rotated out, ``not_after``: a receipt issued
outside that window is refused (its ``issued_at`` is signed by the key, so whoever holds an
old private key can still date a receipt inside the window; keep the keys you trust rather
than fetching them when verifying, see docs/receipts.md).

The **action digest** names one call: the hex SHA-256 of the JCS serialization of
``{"agent", "tool", "arguments", "session", "policy_version"}`` (``session`` null when the call
had none) — :func:`action_digest`. Any system can compute it from the call it holds and compare
it with a receipt's ``action_digest`` (as proposed) or ``approved_digest`` (as approved).

Verification needs ``cryptography`` and ``rfc8785``: ``pip install 'signoff-hooks[verify]'``.
The command line: ``signoff-verify RECEIPT --keys KEYS`` exits 0 only for a valid receipt.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

__all__ = [
    "DIGEST_FIELDS",
    "ReceiptInvalid",
    "action_digest",
    "canonical_bytes",
    "jwk_thumbprint",
    "read_json",
    "receipt_digest",
    "verify_receipt",
]

DIGEST_FIELDS = ("agent", "tool", "arguments", "session", "policy_version")
"""The members of the object whose JCS bytes the action digest is taken over."""

_EXTRA = "pip install 'signoff-hooks[verify]'"


class ReceiptInvalid(ValueError):
    """A receipt that does not verify: the message says which check failed."""


def _rfc8785() -> Any:
    try:
        import rfc8785
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(f"receipts need the rfc8785 package: {_EXTRA}") from exc
    return rfc8785


def canonical_bytes(value: Any) -> bytes:
    """``value`` serialized by RFC 8785 (JCS). Raises :class:`ValueError` for what JCS cannot
    represent (integers beyond ±2**53, NaN, infinities, keys that are not strings)."""
    try:
        return bytes(_rfc8785().dumps(value))
    except ImportError:
        raise
    except Exception as exc:
        raise ValueError(f"not representable in RFC 8785 JSON: {exc}") from exc


def action_digest(
    *,
    agent: str,
    tool: str,
    arguments: Mapping[str, Any],
    session: str | None,
    policy_version: str | None,
) -> str:
    """The hex SHA-256 of the JCS bytes of the call ``{agent, tool, arguments, session,
    policy_version}``, the arguments as the agent sent (or ran) them."""
    value = {
        "agent": agent,
        "tool": tool,
        "arguments": dict(arguments),
        "session": session,
        "policy_version": policy_version,
    }
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def receipt_digest(receipt: Mapping[str, Any]) -> str:
    """The hex SHA-256 of the JCS bytes of a whole receipt (payload, key id and signature):
    how an execution receipt names the decision receipt it follows (``decision_receipt``)."""
    return hashlib.sha256(canonical_bytes(dict(receipt))).hexdigest()


def _unrepeated(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for name, value in pairs:
        if name in seen:
            raise ValueError(f"the key {name!r} is repeated in one object")
        seen[name] = value
    return seen


def read_json(text: str) -> Any:
    """JSON text (a receipt, a request record, a pack, the keys) as the verifier reads it: an
    object that repeats a key is refused (ValueError), since readers that keep the first of
    them and readers that keep the last would read two receipts."""
    return json.loads(text, object_pairs_hook=_unrepeated)


def _b64decode(text: str) -> bytes:
    """Unpadded base64url, spelt one way only: another spelling of the same bytes (padding,
    ``+`` or ``/``, stray characters, other trailing bits) would make another receipt, with
    another digest, that verifies as well. ValueError for anything else."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != text:
        raise ValueError(f"{text!r} is not unpadded base64url")
    return raw


def jwk_thumbprint(x: str) -> str:
    """The RFC 7638 thumbprint of an Ed25519 public key (its base64url ``x``): Signoff's key id."""
    members = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"), sort_keys=True)
    digest = hashlib.sha256(members.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _when(value: Any, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ReceiptInvalid(f"{name} is not a timestamp string")
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ReceiptInvalid(f"{name} {value!r} is not an ISO 8601 timestamp") from None
    if moment.tzinfo is None:
        raise ReceiptInvalid(f"{name} {value!r} has no time zone")
    return moment


def _keys_of(keys: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    listed = keys.get("keys") if isinstance(keys, Mapping) else keys
    if not isinstance(listed, Sequence) or isinstance(listed, str | bytes):
        raise ReceiptInvalid('the keys are not a JWKS ({"keys": [...]}) nor a list of keys')
    return [k for k in listed if isinstance(k, Mapping)]


def verify_receipt(
    receipt: Mapping[str, Any],
    keys: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    call: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Check ``receipt`` against the published ``keys`` (the JWKS of ``GET /v1/receipts/keys``,
    or its list): its key is among them, the signature is the key's over the payload's JCS
    bytes, and the receipt was issued while the key was in use. With ``call`` (``{agent, tool,
    arguments, session, policy_version}``), also that the receipt covers that call: a decision
    receipt approved it (verdict ``approved``, its ``approved_digest``), an execution receipt
    reports it run as approved (its ``action_digest``, ``executed_mismatch`` false). Returns
    the payload; raises :class:`ReceiptInvalid` naming what failed."""
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(f"receipt verification needs the cryptography package: {_EXTRA}") from exc
    if not isinstance(receipt, Mapping):
        raise ReceiptInvalid("a receipt is a JSON object {payload, key_id, signature}")
    extra = set(receipt) - {"payload", "key_id", "signature"}
    if extra:
        raise ReceiptInvalid(
            f"unknown receipt fields {sorted(extra)}: a receipt holds payload, key_id, signature"
        )
    payload, kid, signature = receipt.get("payload"), receipt.get("key_id"), receipt.get("signature")
    if not isinstance(payload, Mapping):
        raise ReceiptInvalid("the receipt has no payload object")
    if not isinstance(kid, str) or not kid:
        raise ReceiptInvalid("the receipt has no key_id")
    if not isinstance(signature, str) or not signature:
        raise ReceiptInvalid("the receipt has no signature")
    found = [k for k in _keys_of(keys) if k.get("kid") == kid]
    if not found:
        raise ReceiptInvalid(
            f"key {kid!r} is not among the published keys: fetch GET /v1/receipts/keys again"
        )
    key = found[0]
    if key.get("kty") != "OKP" or key.get("crv") != "Ed25519" or not isinstance(key.get("x"), str):
        raise ReceiptInvalid(f"key {kid!r} is not an Ed25519 public key (kty OKP, crv Ed25519, x)")
    try:
        raw_key = _b64decode(key["x"])
        raw_signature = _b64decode(signature)
        public = Ed25519PublicKey.from_public_bytes(raw_key)
    except ValueError:
        raise ReceiptInvalid(f"key {kid!r} or the signature is not valid base64url") from None
    if jwk_thumbprint(key["x"]) != kid:
        raise ReceiptInvalid(f"key {kid!r} is not the thumbprint of its own x: the key set was altered")
    try:
        message = canonical_bytes(dict(payload))
    except ValueError as exc:
        raise ReceiptInvalid(f"the payload is not canonical JSON: {exc}") from None
    try:
        public.verify(raw_signature, message)
    except InvalidSignature:
        raise ReceiptInvalid(f"the signature does not match the payload under key {kid!r}") from None
    issued = _when(payload.get("issued_at"), "issued_at")
    if issued is None:
        raise ReceiptInvalid("the payload has no issued_at")
    not_before = _when(key.get("not_before"), "the key's not_before")
    not_after = _when(key.get("not_after"), "the key's not_after")
    if not_before is not None and issued < not_before:
        raise ReceiptInvalid(
            f"the receipt was issued at {payload['issued_at']}, before key {kid!r} was in use"
        )
    if not_after is not None and issued >= not_after:
        raise ReceiptInvalid(
            f"the receipt was issued at {payload['issued_at']}, after key {kid!r} was rotated out"
        )
    if call is not None:
        _check_call(payload, call)
    return dict(payload)


def _check_call(payload: Mapping[str, Any], call: Mapping[str, Any]) -> None:
    missing = [name for name in DIGEST_FIELDS if name not in call]
    if missing:
        raise ReceiptInvalid(f"the call lacks {', '.join(missing)}: give {{{', '.join(DIGEST_FIELDS)}}}")
    try:
        digest = action_digest(**{name: call[name] for name in DIGEST_FIELDS})
    except ValueError as exc:
        raise ReceiptInvalid(f"the call has no action digest: {exc}") from None
    kind = payload.get("kind")
    if kind == "decision" and payload.get("verdict") != "approved":
        raise ReceiptInvalid(
            f"the receipt does not approve this call: its verdict is {payload.get('verdict')!r}"
        )
    if kind == "execution" and payload.get("executed_mismatch") is not False:
        raise ReceiptInvalid(
            "the receipt reports a call run otherwise than approved (executed_mismatch): it covers no call"
        )
    if kind not in ("decision", "execution"):
        raise ReceiptInvalid(
            f"the receipt is of kind {kind!r}: only decision and execution receipts cover a call"
        )
    field = "approved_digest" if kind == "decision" else "action_digest"
    if payload.get(field) != digest:
        what = "approve" if field == "approved_digest" else "report executed"
        raise ReceiptInvalid(f"the receipt does not {what} this call: its {field} is not the call's digest")


def main(argv: Sequence[str] | None = None) -> int:
    """``signoff-verify RECEIPT --keys KEYS``: 0 for a valid receipt, 1 for an invalid one, 2
    for a file that cannot be read. ``RECEIPT`` may also be a request record (its ``receipt``)
    or an execution answer; ``-`` reads standard input."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="signoff-verify", description="Verify a Signoff receipt offline, with the published keys."
    )
    parser.add_argument("receipt", help="the receipt JSON file (- for standard input)")
    parser.add_argument("--keys", required=True, help="the keys JSON file (GET /v1/receipts/keys)")
    parser.add_argument(
        "--call",
        help="also check that it covers this call (JSON: agent, tool, arguments, session, policy_version)",
    )
    args = parser.parse_args(argv)

    def read(path: str) -> Any:
        if path == "-":
            return read_json(sys.stdin.read())
        with open(path, encoding="utf-8") as f:
            return read_json(f.read())

    try:
        receipt = read(args.receipt)
        keys = read(args.keys)
        call = None if args.call is None else read(args.call)
    except (OSError, ValueError) as exc:
        sys.stderr.write(
            f"signoff-verify: cannot read the input ({exc}); give a receipt file and --keys KEYS\n"
        )
        return 2
    if isinstance(receipt, dict) and "payload" not in receipt and isinstance(receipt.get("receipt"), dict):
        receipt = receipt["receipt"]  # a request record or an answer that carries one
    try:
        payload = verify_receipt(receipt, keys, call=call)
    except ReceiptInvalid as exc:
        sys.stderr.write(f"signoff-verify: invalid receipt: {exc}\n")
        return 1
    except ImportError as exc:
        sys.stderr.write(f"signoff-verify: {exc}\n")
        return 2
    what = payload.get("verdict") or ("mismatch" if payload.get("executed_mismatch") else "as approved")
    sys.stdout.write(f"valid {payload.get('kind')} receipt for request {payload.get('request_id')}: {what}\n")
    return 0
