"""``signoff receipts verify|keys|rotate`` and ``signoff audit export --receipts``: an evidence
pack over a period, checked offline; a decision from the command line is signed too."""

from __future__ import annotations

import json
from pathlib import Path

from signoff.hooks.receipts import verify_receipt
from tests.app.test_cli import Cli, cli, migrated  # noqa: F401  (the fixtures)


def test_a_decision_from_the_command_line_is_signed_and_verifies(cli: Cli, tmp_path: Path) -> None:  # noqa: F811
    rid = cli.request()
    cli.ok("requests", "approve", rid, "--as", "alice", "--reason", "ok")
    record = json.loads(cli.ok("requests", "show", rid))
    keys = json.loads(cli.ok("receipts", "keys"))
    payload = verify_receipt(record["receipt"], keys)
    assert (payload["request_id"], payload["verdict"], payload["reason"]) == (rid, "approved", "ok")
    (tmp_path / "record.json").write_text(json.dumps(record))
    assert cli.ok("receipts", "verify", str(tmp_path / "record.json")).strip() == "1 receipt valid"


def test_the_evidence_pack_verifies_offline_and_survives_rotation(cli: Cli, tmp_path: Path) -> None:  # noqa: F811
    first = cli.request()
    cli.ok("requests", "reject", first, "--as", "bob", "--reason", "no")
    rotated = cli.ok("receipts", "rotate")
    assert rotated.startswith("receipts are now signed with key ")
    second = cli.request()
    cli.ok("requests", "approve", second, "--as", "alice")

    pack = json.loads(cli.ok("audit", "export", "--receipts", "--since", "2000-01-01"))
    assert [r["request_id"] for r in pack["receipts"]] == [first, second]
    assert len(pack["keys"]) == 2
    assert pack["receipts"][0]["receipt"]["key_id"] != pack["receipts"][1]["receipt"]["key_id"]
    path = tmp_path / "pack.json"
    path.write_text(json.dumps(pack))
    said = cli.ok("receipts", "verify", str(path)).strip()
    assert said.startswith("2 receipts valid, under the pack's own keys (")
    assert all(k["kid"] in said for k in pack["keys"])
    assert "GET /v1/receipts/keys" in said
    (tmp_path / "keys.json").write_text(json.dumps({"keys": pack["keys"]}))
    assert cli.ok("receipts", "verify", str(path), "--keys", str(tmp_path / "keys.json")).strip() == (
        "2 receipts valid"
    )

    # Nothing decided in the period: an empty pack.
    empty = json.loads(cli.ok("audit", "export", "--receipts", "--until", "2000-01-01"))
    assert empty["receipts"] == []

    # One changed byte in the pack: refused, naming the request.
    pack["receipts"][1]["receipt"]["payload"]["verdict"] = "rejected"
    path.write_text(json.dumps(pack))
    done = cli("receipts", "verify", str(path))
    assert done.returncode == 1
    assert f"invalid: request {second}: the signature does not match" in done.stderr
    assert "1 of 2 receipts did not verify" in done.stderr


def test_bad_input_is_one_line_naming_the_fix(cli: Cli, tmp_path: Path) -> None:  # noqa: F811
    done = cli("audit", "export")
    assert done.returncode == 1
    assert "--receipts" in done.stderr
    done = cli("audit", "export", "--receipts", "--since", "yesterday")
    assert done.returncode == 1
    assert "not an ISO 8601 date" in done.stderr
    (tmp_path / "x.json").write_text("{")
    done = cli("receipts", "verify", str(tmp_path / "x.json"))
    assert done.returncode == 1
    assert "cannot be read as JSON" in done.stderr


def test_an_operator_key_missing_from_a_process_stops_it_deciding_and_serving(
    cli: Cli,  # noqa: F811
    tmp_path: Path,
) -> None:
    import base64

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from tests.conftest import free_port

    raw = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    cli.env["SIGNOFF_RECEIPT_KEY"] = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    signed = cli.request()
    cli.ok("requests", "approve", signed, "--as", "alice")
    del cli.env["SIGNOFF_RECEIPT_KEY"]

    unsigned = cli.request()
    done = cli("requests", "approve", unsigned, "--as", "alice")
    assert done.returncode != 0
    assert "held by the operator" in done.stderr
    assert "SIGNOFF_RECEIPT_KEY" in done.stderr
    assert cli.row(unsigned).status == "pending", "nothing is decided unsigned"

    process = Cli(tmp_path, process=True)  # the same database, as the installed command
    process.env["SIGNOFF_PORT"] = str(free_port())
    done = process("serve", "--no-migrate")
    assert done.returncode == 2
    assert "held by the operator" in done.stderr

    cli.env["SIGNOFF_RECEIPT_KEY"] = "not a key"
    done = cli("requests", "list")
    assert done.returncode == 2
    assert "SIGNOFF_RECEIPT_KEY: the receipt key is" in done.stderr
