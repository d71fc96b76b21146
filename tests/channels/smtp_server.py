"""A real SMTP server on loopback (aiosmtpd) for the email channel's tests.

It receives what the channel sends, and answers as a scripted mail server would: a
recipient refused with a 4xx or 5xx reply, a login refused, STARTTLS offered or not, TLS
from the first byte. Each server runs on its own thread and event loop (aiosmtpd's
``Controller``).
"""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import ipaddress
import ssl
import threading
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.conftest import free_port

__all__ = ["LocalSmtp", "Received", "self_signed"]


@dataclass(frozen=True)
class Received:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage

    def part(self, subtype: str) -> str:
        body = self.message.get_body(preferencelist=(subtype,))
        assert body is not None, f"no text/{subtype} part"
        content: str = body.get_content()  # type: ignore[attr-defined]
        return content


@dataclass
class _Handler:
    received: list[Received] = field(default_factory=list)
    rcpt_replies: dict[str, str] = field(default_factory=dict)
    """Address → the reply its ``RCPT TO`` gets (``"450 4.2.1 Mailbox busy"``)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        with self.lock:
            reply = self.rcpt_replies.get(address.lower())
        if reply is not None:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or b""
        message = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        with self.lock:
            self.received.append(Received(str(envelope.mail_from), list(envelope.rcpt_tos), message))
        return "250 Message accepted for delivery"


class LocalSmtp:
    """A loopback SMTP server; ``users`` turns on AUTH (only over TLS unless ``tls`` is off)."""

    def __init__(
        self,
        *,
        users: dict[str, str] | None = None,
        starttls: ssl.SSLContext | None = None,
        implicit_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.port = free_port()
        self.handler = _Handler()
        self.users = users or {}
        smtp: dict[str, Any] = {"enable_SMTPUTF8": True}
        if starttls is not None:
            smtp["tls_context"] = starttls
            smtp["require_starttls"] = True
        if users is not None:
            smtp["authenticator"] = self._authenticate
            smtp["auth_required"] = True
            smtp["auth_require_tls"] = starttls is not None or implicit_tls is not None
        self._controller = Controller(
            self.handler,
            hostname="127.0.0.1",
            port=self.port,
            ready_timeout=10,
            ssl_context=implicit_tls,
            server_hostname="mail.test",
            **smtp,
        )

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        ok = isinstance(data, LoginPassword) and self.users.get(data.login.decode()) == data.password.decode()
        return AuthResult(success=ok, handled=False)

    def __enter__(self) -> LocalSmtp:
        self._controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._controller.stop()

    @property
    def received(self) -> list[Received]:
        with self.handler.lock:
            return list(self.handler.received)

    def refuse(self, address: str, reply: str) -> None:
        with self.handler.lock:
            self.handler.rcpt_replies[address.lower()] = reply

    def accept(self, address: str) -> None:
        with self.handler.lock:
            self.handler.rcpt_replies.pop(address.lower(), None)

    def to(self, address: str) -> list[Received]:
        return [r for r in self.received if address in r.rcpt_tos]


def self_signed(directory: Path) -> tuple[ssl.SSLContext, Path]:
    """A server TLS context for ``127.0.0.1`` with a fresh self-signed certificate, and the
    certificate's file (a client trusts it as its CA bundle)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "smtp-cert.pem", directory / "smtp-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context, cert_file
