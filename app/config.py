"""The YAML configuration: channels, the people directory and each agent's hooks.

Loading validates everything at once and reports the file, the path inside it and
what is wrong, e.g. ``signoff.yaml: agents.finance-bot.hooks[0].quorum: …``.
Secrets are written as ``${ENV_VAR}`` and read from the environment at load.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, cast, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from signoff.app.builtin_hooks.audit_log import AuditLog
from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.builtin_hooks.context_inject import ContextInject
from signoff.app.builtin_hooks.rate_limit import RateLimit
from signoff.app.builtin_hooks.readonly_guard import ReadOnlyGuard
from signoff.app.builtin_hooks.result_truncate import ResultTruncate
from signoff.app.channel_types import CHANNEL_TYPES, ChannelConfig, identity_of
from signoff.app.redaction import Redactor
from signoff.app.spelling import closest
from signoff.channels import duration_text

HookConfig = ConfirmationGate | ReadOnlyGuard | RateLimit | ResultTruncate | AuditLog | ContextInject
"""Every hook type an agent's ``hooks`` list may hold, told apart by ``type``."""
HOOK_TYPES = (
    "confirmation_gate",
    "readonly_guard",
    "rate_limit",
    "result_truncate",
    "audit_log",
    "context_inject",
)

__all__ = [
    "GRANT_CREATED",
    "GRANT_REVOKED",
    "REQUEST_CREATED",
    "REQUEST_DECIDED",
    "WEBHOOK_EVENTS",
    "AgentConfig",
    "ConfigError",
    "ConsoleConfig",
    "OidcConfig",
    "Operator",
    "Person",
    "SignoffConfig",
    "WebhookConfig",
    "identity_key",
    "load_config",
    "parse_config",
]

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_REDACT = (
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "token",
    "api_key",
    "access_key",
    "private_key",
    "credential",
    "authorization",
    "cookie",
)
"""Redact words: a value is redacted under any key containing one, in any spelling (case,
``-``, ``_``, spaces, camelCase: see signoff.app.redaction)."""


_BY_EMAIL = tuple(kind for kind, registered in CHANNEL_TYPES.items() if registered.identity.by_email)
"""The channel types that address people by their directory email."""


def identity_key(value: str) -> str:
    """The form in which a spelling of someone's key, channel id or email is compared.

    NFKC (full-width and other compatibility forms become plain letters), case-folded,
    without invisible format characters (zero-width spaces, joiners, direction marks)
    and without surrounding whitespace: ``" DANA\u200b"``, its full-width form and ``"dana"``
    are one key.
    """
    visible = "".join(ch for ch in value if unicodedata.category(ch) != "Cf")
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", visible).casefold())
    return folded.strip()


class ConfigError(ValueError):
    """The configuration is invalid; ``problems`` lists each as ``file: path: message``."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class Person(BaseModel):
    """One entry of the people directory: a name and their ids per channel type."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str | None = None
    email: str | None = None
    """Recognises them too: as a requester's ``user_id``, and as a clicker's looked-up email."""

    def ids(self) -> dict[str, str]:
        """Channel type → user id (``slack: U0ALICE``)."""
        return {k: str(v) for k, v in (self.model_extra or {}).items()}

    def id_on(self, channel_type: str) -> str | None:
        """Their user id on ``channel_type``: the entry named after it, or their email where the
        channel type addresses people by email."""
        if identity_of(channel_type).by_email:
            return self.email or None
        return self.ids().get(channel_type)

    def identifiers(self, key: str) -> Iterator[tuple[str, str]]:
        """Everything that names this person, with where it is written: their directory
        ``key``, each channel id and their email."""
        yield "", key
        yield from self.ids().items()
        if self.email:
            yield "email", self.email


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hooks: tuple[Annotated[HookConfig, Field(discriminator="type")], ...] = ()
    redact: tuple[str, ...] = ()


class Operator(BaseModel):
    """Someone who may sign in to the console; decisions there are recorded under ``person``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    password_hash: SecretStr
    """Made by ``signoff operators hash-password``."""
    person: str | None = None
    """Their key in ``people`` (defaults to the operator's own name)."""


REQUEST_CREATED = "request.created"
REQUEST_DECIDED = "request.decided"
GRANT_CREATED = "grant.created"
GRANT_REVOKED = "grant.revoked"
WEBHOOK_EVENTS = (REQUEST_CREATED, REQUEST_DECIDED, GRANT_CREATED, GRANT_REVOKED)
"""The events a request or a grant emits (:func:`signoff.app.db.emit`), which webhooks subscribe to."""
"""The events a webhook may subscribe to."""
WEBHOOK_SECRET_PREFIX = "whsec_"
_WEBHOOK_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


class WebhookConfig(BaseModel):
    """One receiver of signed events (Standard Webhooks). Its URL comes from this file only:
    nothing a caller sends ever names where Signoff connects to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    """``https://…`` (or ``http://``), without credentials in it."""
    secret: SecretStr
    """``whsec_`` and the base64 of 24 to 64 random bytes: the form every Standard Webhooks
    library takes, so the receiver is configured with the same string."""
    events: tuple[str, ...] = Field(min_length=1)
    timeout: float = Field(default=10.0, gt=0, le=25)
    """Seconds to wait for the receiver's answer (within the outbox lease, so that no other
    dispatcher sends the event again meanwhile)."""
    max_attempts: int = Field(default=12, ge=1, le=60)
    """Attempts before the event is given up as failed (backing off up to 5 minutes apart)."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        try:
            parts = urlsplit(value.strip())
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError as exc:
            raise ValueError(f"not a URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("an http:// or https:// URL with a host, e.g. https://hooks.example.com/signoff")
        if parts.username is not None or parts.password is not None:
            raise ValueError("credentials do not belong in the URL (receivers check the signature)")
        return value.strip()

    @field_validator("secret")
    @classmethod
    def _standard_secret(cls, value: SecretStr) -> SecretStr:
        text = value.get_secret_value().strip()
        encoded = text.removeprefix(WEBHOOK_SECRET_PREFIX)
        try:
            key = base64.b64decode(encoded, validate=True) if text != encoded else b""
        except (binascii.Error, ValueError):
            key = b""
        if not 24 <= len(key) <= 64:
            raise ValueError(
                f"a Standard Webhooks secret: {WEBHOOK_SECRET_PREFIX} and the base64 of 24 to 64 random "
                f"bytes, e.g. {WEBHOOK_SECRET_PREFIX}$(openssl rand -base64 32)"
            )
        return SecretStr(text)

    @field_validator("events")
    @classmethod
    def _known_events(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [e for e in value if e not in WEBHOOK_EVENTS]
        if unknown:
            raise ValueError(f"unknown event {unknown[0]!r}; the events are {', '.join(WEBHOOK_EVENTS)}")
        return tuple(dict.fromkeys(value))

    def signing_key(self) -> bytes:
        """The HMAC key: the secret's bytes."""
        return base64.b64decode(self.secret.get_secret_value().removeprefix(WEBHOOK_SECRET_PREFIX))

    def plaintext(self) -> bool:
        """Whether events go unencrypted over the network (``http://`` to another machine)."""
        host = urlsplit(self.url).hostname or ""
        if urlsplit(self.url).scheme != "http" or host == "localhost":
            return False
        try:
            return not ipaddress.ip_address(host).is_loopback
        except ValueError:
            return True


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OidcConfig(BaseModel):
    """``console.oidc``: console sign-in through the organisation's identity provider (OpenID
    Connect: discovery, authorization code with PKCE, state and nonce, a checked ID token)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str
    """The provider's issuer URL (``https://login.example.com/realms/corp``): its discovery
    document is at ``<issuer>/.well-known/openid-configuration`` and must name this issuer."""
    client_id: str = Field(min_length=1)
    client_secret: SecretStr
    scopes: tuple[str, ...] = ("openid", "email", "profile")
    username_claim: str = "email"
    """The claim that names the person: matched against the directory's emails (``email``,
    when the provider has verified it) or its keys and emails (any other claim)."""
    groups_claim: str | None = None
    """The claim listing the person's groups (``groups``), for ``group:NAME`` approvers;
    read from the ID token, else from the userinfo endpoint."""
    recheck_seconds: int = Field(default=600, ge=1, le=86400)
    """How long a sign-in counts before the provider is asked again, without a prompt
    (``prompt=none``): an account disabled there is signed out at its next request after that."""
    trust_unverified_email: bool = False
    """With ``username_claim: email``: map a person by an email the provider did not say it
    verified (one that never sends ``email_verified``, such as Microsoft Entra ID). Then
    whoever can put that email on an account at the provider signs in as that person: give
    people their ``oidc:`` subject instead where you can. Off: only a verified email maps."""

    @field_validator("issuer")
    @classmethod
    def _https_issuer(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.query or parts.fragment or not parts.hostname:
            raise ValueError("the issuer is an https:// URL without query or fragment")
        if parts.scheme != "https" and not (parts.scheme == "http" and _loopback(parts.hostname)):
            raise ValueError("the issuer must be https:// (http:// only on this machine, for testing)")
        return value.strip().rstrip("/")

    @field_validator("scopes")
    @classmethod
    def _openid_scope(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if "openid" not in value:
            raise ValueError("scopes must include openid (the ID token comes with it)")
        return tuple(dict.fromkeys(value))


class ConsoleConfig(BaseModel):
    """``console``: how people sign in to the console."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    oidc: OidcConfig | None = None
    password_sign_in: bool = True
    """Whether ``operators`` may sign in with their passwords (false: only through ``oidc``)."""


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    channels: dict[str, dict[str, Any]] = {}
    people: dict[str, Person] = {}
    operators: dict[str, Operator] = {}
    agents: dict[str, AgentConfig] = {}
    webhooks: dict[str, WebhookConfig] = {}
    console: ConsoleConfig = ConsoleConfig()
    redact: tuple[str, ...] = DEFAULT_REDACT
    version: Literal[1] = 1


@dataclass(frozen=True, eq=False)
class SignoffConfig:
    """A validated configuration (equal only to itself: what it derives is kept with it)."""

    channels: Mapping[str, ChannelConfig] = field(default_factory=dict)
    people: Mapping[str, Person] = field(default_factory=dict)
    agents: Mapping[str, AgentConfig] = field(default_factory=dict)
    redact: frozenset[str] = frozenset(DEFAULT_REDACT)
    source: str = "<default>"
    operators: Mapping[str, Operator] = field(default_factory=dict)
    version: str = ""
    """:func:`config_version` of this configuration."""
    webhooks: Mapping[str, WebhookConfig] = field(default_factory=dict)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)

    @cached_property
    def _subscribers(self) -> dict[str, tuple[str, ...]]:
        return {e: tuple(n for n, w in self.webhooks.items() if e in w.events) for e in WEBHOOK_EVENTS}

    def subscribers(self, event: str) -> tuple[str, ...]:
        """The webhooks that ``event`` is sent to, by name."""
        return self._subscribers.get(event, ())

    def channel_type(self, channel: str) -> str:
        return self.channels[channel].type

    def is_web(self, channel: str) -> bool:
        """Whether ``channel`` is of type ``web`` (whatever its name): decided in Signoff itself,
        no card is posted anywhere. An unknown channel is not: its card fails to post."""
        config = self.channels.get(channel)
        return config is not None and config.type == "web"

    @cached_property
    def _everyone(self) -> dict[str, str]:
        """Every identifier (key, channel id, email) as :func:`identity_key` → directory key."""
        return _identifiers(self.people)

    @cached_property
    def _by_channel_type(self) -> dict[tuple[str, str], str]:
        """(channel type, :func:`identity_key` of a user id) → directory key; on ``web`` the
        directory key itself is a user id (operators sign in by it)."""
        index: dict[tuple[str, str], str] = {}
        for key, person in self.people.items():
            index[("web", identity_key(key))] = key
            for kind, user_id in person.ids().items():
                index[(kind, identity_key(user_id))] = key
            if person.email:
                for kind in _BY_EMAIL:
                    index[(kind, identity_key(person.email))] = key
        return index

    def person_for(self, channel_type: str, user_id: str) -> str | None:
        """The directory key of whoever has ``user_id`` on ``channel_type`` (or is named so).

        Spelling does not matter (see :func:`identity_key`)."""
        return self._by_channel_type.get((channel_type, identity_key(user_id)))

    def recognise(self, user_id: str | None) -> str | None:
        """The directory key for someone given by their key, any channel id or their email,
        in any spelling (see :func:`identity_key`)."""
        if user_id is None:
            return None
        return self._everyone.get(identity_key(user_id))

    @cached_property
    def _agent_redact(self) -> dict[str, frozenset[str]]:
        return {
            agent: self.redact | frozenset(w.lower() for w in cfg.redact)
            for agent, cfg in self.agents.items()
        }

    def redact_words(self, agent: str) -> frozenset[str]:
        """The redact words for what ``agent`` sends: the global ones and the agent's own."""
        return self._agent_redact.get(agent, self.redact)

    @cached_property
    def _confirmation_gates(self) -> dict[str, tuple[tuple[str, ConfirmationGate], ...]]:
        keyed: dict[str, tuple[tuple[str, ConfirmationGate], ...]] = {}
        for agent, cfg in self.agents.items():
            gates = [h for h in cfg.hooks if isinstance(h, ConfirmationGate)]
            labels = Counter(g.label for g in gates)
            seen: Counter[str] = Counter()
            named = []
            for gate in gates:
                seen[gate.label] += 1
                key = gate.label if labels[gate.label] == 1 else f"{gate.label} #{seen[gate.label]}"
                named.append((key, gate))
            keyed[agent] = tuple(sorted(named, key=lambda kg: kg[1].priority))  # the order they run
        return keyed

    def confirmation_gates(self, agent: str) -> tuple[tuple[str, ConfirmationGate], ...]:
        """The agent's confirmation gates in the order they run, each with the key a request
        records it by: its name (numbered when two gates share one)."""
        return self._confirmation_gates.get(agent, ())

    def channel_id_of(self, person: str, channel_type: str) -> str | None:
        entry = self.people.get(person)
        if entry is None:
            return None
        return entry.id_on(channel_type) or (person if channel_type == "web" else None)

    def display_name(self, person: str) -> str:
        entry = self.people.get(person)
        return (entry.name if entry and entry.name else None) or person

    def warnings(self) -> list[str]:
        """Settings that are valid but weaken security or are likely not meant, as
        ``file: path: message`` lines."""
        found: list[str] = []
        for name, channel in self.channels.items():
            # A channel's config may say what it weakens (Feishu's ``allow_unsigned``).
            warn = getattr(channel, "warnings", None)
            if callable(warn):
                found += [f"{self.source}: channels.{name}.{w}" for w in warn()]
        for name, webhook in self.webhooks.items():
            if webhook.plaintext():
                found.append(
                    f"{self.source}: webhooks.{name}.url: http:// sends every event unencrypted; use https://"
                )
        for agent, cfg in self.agents.items():
            for i, hook in enumerate(cfg.hooks):
                if isinstance(hook, ConfirmationGate) and not hook.approvers:
                    who = (
                        "any operator"
                        if self.is_web(hook.channel)
                        else f"anyone in the channel {hook.channel!r}"
                    )
                    found.append(
                        f"{self.source}: agents.{agent}.hooks[{i}].approvers: none listed, "
                        f"so {who} may approve; list the people who may"
                    )
        return found


def _expand_env(node: Any, path: str, problems: list[str]) -> Any:
    if isinstance(node, str):

        def sub(m: re.Match[str]) -> str:
            value = os.environ.get(m.group(1))
            if value is None:
                problems.append(
                    f"{path}: environment variable {m.group(1)} is not set; "
                    f"export {m.group(1)}=… where the server (and signoff) runs"
                )
                return ""
            return value

        return _ENV_REF.sub(sub, node)
    if isinstance(node, dict):
        return {k: _expand_env(v, f"{path}.{k}" if path else str(k), problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_expand_env(v, f"{path}[{i}]", problems) for i, v in enumerate(node)]
    return node


def _loc(loc: Iterable[int | str]) -> str:
    out = ""
    previous: int | str = ""
    for part in loc:
        # A hook's type appears in the location after its index; the path is clearer without it.
        skip = isinstance(previous, int) and part in HOOK_TYPES
        previous = part
        if skip:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _step(tp: Any, part: int | str) -> Any:
    """What is found at ``part`` of a value of type ``tp`` (None: not known): a model's
    field, a mapping's value, a sequence's item, or the member of a union of models whose
    ``type`` is ``part`` (how pydantic names a discriminated union's member)."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    args = get_args(tp)
    if get_origin(tp) in (Union, UnionType):
        members = [m for m in args if m is not type(None)]
        if len(members) == 1:
            return _step(members[0], part)
        for member in members:
            kind = getattr(member, "model_fields", {}).get("type")
            if kind is not None and kind.default == part:
                return member
        return None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(str(part))
        return field.annotation if field is not None else None
    if get_origin(tp) in (dict, Mapping) and len(args) == 2:
        return args[1]
    if get_origin(tp) in (tuple, list) and args:
        return args[0]
    return None


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys the mapping at ``loc`` under ``model`` accepts (none known: ``[]``)."""
    tp: Any = model
    for part in loc:
        tp = _step(tp, part)
    while get_origin(tp) in (Annotated, Union, UnionType):
        members = [m for m in get_args(tp) if m is not type(None)]
        tp = members[0] if len(members) == 1 or get_origin(tp) is Annotated else None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [f.alias or name for name, f in tp.model_fields.items()]
    return []


def _unknown_key(key: str, known: list[str]) -> str:
    meant = closest(key, known)
    hint = f"did you mean `{meant}`?" if meant else ""
    listed = f"the keys here are {', '.join(f'`{k}`' for k in known)}" if known else ""
    return "unknown key" + "".join(f"; {part}" for part in (hint, listed) if part)


def _errors(exc: ValidationError, prefix: str, model: type[BaseModel]) -> list[str]:
    problems = []
    for err in exc.errors():
        where = _loc(err["loc"])
        where = f"{prefix}.{where}" if prefix and where else prefix or where
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "missing: this key is required"
        elif err["type"] == "extra_forbidden" and err["loc"]:
            msg = _unknown_key(str(err["loc"][-1]), _keys_at(model, tuple(err["loc"][:-1])))
        if err["type"] in ("union_tag_not_found", "union_tag_invalid"):
            known = ", ".join(HOOK_TYPES)
            given = (
                f"unknown hook type {err['input'].get('type')!r}"
                if err["type"] == "union_tag_invalid"
                else ""
            )
            msg = f"{given or 'a hook needs a `type`'}; one of {known}"
        problems.append(f"{where or '(top level)'}: {msg}")
    return problems


def _ambiguous_people(people: Mapping[str, Person]) -> list[str]:
    """Identifiers naming two people: recognition must know whom a spelling means."""
    problems: list[str] = []
    owner: dict[str, str] = {}
    for key, person in people.items():
        for where, value in person.identifiers(key):
            ident = identity_key(value)
            if not ident:
                continue
            other = owner.setdefault(ident, key)
            if other != key:
                path = f"people.{key}.{where}" if where else f"people.{key}"
                problems.append(
                    f"{path}: {value!r} also names people.{other}; every key, channel id and "
                    "email (in any letter case) must belong to one person"
                )
    return problems


def _identifiers(people: Mapping[str, Person]) -> dict[str, str]:
    """Every identifier of the directory (key, channel id, email) as :func:`identity_key` →
    the directory key it names."""
    return {
        identity_key(value): key
        for key, person in people.items()
        for _, value in person.identifiers(key)
        if identity_key(value)
    }


def _deciders(operators: Mapping[str, Operator]) -> set[str]:
    """The names operators decide under: their ``person``, else their own name."""
    return {operator.person or name for name, operator in operators.items()}


def _unknown_approver(approver: str, kind: str, doc: _File) -> str:
    """Why ``approver`` names nobody on a ``kind`` channel, and the likely fix."""
    operator = doc.operators.get(approver)
    if operator is not None and operator.person:
        return (
            f"{approver!r} is an operator who decides as {operator.person!r}; "
            f"list {operator.person!r} instead"
        )
    identity = identity_of(kind)
    # Raw ids of a personal type (ntfy topics) are no approvers, and never suggested: secrets.
    patterned = identity.user_id is not None and not identity.personal
    article = "an" if kind[:1] in "aeiou" else "a"
    what = f"{article} {kind} user id" if patterned else "an operator"
    meant = _identifiers(doc.people).get(identity_key(approver))
    if meant is None:
        meant = closest(approver, [*doc.people, *_deciders(doc.operators)])
    if meant is None and patterned:
        meant = closest(approver, filter(None, (p.id_on(kind) for p in doc.people.values())))
    fix = f"did you mean {meant!r}?" if meant is not None else "add them under people"
    return f"{approver!r} is neither in people nor {what}; {fix}"


def _group_problems(approver: str, kind: str, channel: str, doc: _File) -> list[str]:
    """Why ``group:NAME`` cannot approve on the ``kind`` channel ``channel`` (none: it can)."""
    if not approver.removeprefix("group:").strip():
        return [f"{approver!r} names no group; write group:NAME, e.g. group:payments-leads"]
    oidc = doc.console.oidc
    if oidc is None or not oidc.groups_claim:
        return [
            f"{approver!r} is a group of the identity provider, but console.oidc.groups_claim is not "
            "set; configure console.oidc with groups_claim (e.g. groups)"
        ]
    if identity_of(kind).by_email:
        return [
            f"{approver!r}: the {kind} channel {channel!r} mails each approver, and a group has no "
            "address; list people, or put the gate on a channel its members see"
        ]
    return []


def _approver_problems(
    approvers: Iterable[str], where: str, kind: str, doc: _File, *, channel: str
) -> list[str]:
    """Approvers the ``kind`` channel ``channel`` cannot recognise (or, sending by email,
    reach). Each must be a person of the directory (with an id of that type, or an email,
    where the type needs one), a console operator (who decides wherever the card went),
    or a raw user id of the form the type gives its ids. A type with no ids of its own
    (``web``, ``fake``) takes no raw ids: a misspelt name would otherwise become an
    approver anyone could claim to be (``signoff requests approve --as alcie``)."""
    identity = identity_of(kind)
    deciders = _deciders(doc.operators)
    problems: list[str] = []
    for j, approver in enumerate(approvers):
        if approver.startswith("group:"):
            problems.extend(f"{where}[{j}]: {p}" for p in _group_problems(approver, kind, channel, doc))
            continue
        person = doc.people.get(approver)
        if person is not None:
            if identity.by_email and not person.email:
                problems.append(
                    f"{where}[{j}]: {approver!r} has no email in people, so the {kind} channel "
                    f"{channel!r} cannot reach them; add `email: <address>` to people.{approver}"
                )
            elif not identity.by_email and identity.user_id is not None and kind not in person.ids():
                problems.append(
                    f"{where}[{j}]: {approver!r} has no {kind} id in people; "
                    f"add `{kind}: <user id>` to people.{approver}"
                )
            elif identity.personal and not identity.is_user_id(person.ids()[kind]):
                problems.append(
                    f"{where}[{j}]: people.{approver}.{kind} is not a valid {kind} id "
                    f"(letters, digits, - and _, at most 64); fix people.{approver}.{kind}"
                )
        elif approver in deciders or (
            # A channel that messages each person at an id of their own takes no raw ids: a
            # misspelt name would be a topic anyone could subscribe to.
            identity.user_id is not None and not identity.personal and identity.is_user_id(approver)
        ):
            continue
        else:
            problems.append(f"{where}[{j}]: {_unknown_approver(approver, kind, doc)}")
    return problems


def _gate_problems(
    gate: ConfirmationGate, where: str, channels: Mapping[str, ChannelConfig], doc: _File
) -> list[str]:
    """What is wrong with a confirmation gate beyond its own fields: its channels, its
    approvers, and reminders or escalations that could never happen before its timeout."""
    problems: list[str] = []

    def channel_problem(name: str, path: str, hint: str = "") -> str | None:
        if name in channels:
            return None
        if name in doc.channels:
            return ""  # an invalid channel is reported once, where it is declared
        return f"{path}: no channel named {name!r} under channels{hint}"

    timeout = gate.timeout
    limit = duration_text(int(timeout.total_seconds()))
    seen: dict[timedelta, int] = {}
    for j, point in enumerate(gate.remind):
        due = point.due(timeout)
        if due >= timeout:
            problems.append(
                f"{where}.remind[{j}]: {point} is at or after the gate's timeout ({limit}); "
                f"remind before it, e.g. 50%"
            )
        elif due in seen:
            problems.append(f"{where}.remind[{j}]: {point} is the same time as remind[{seen[due]}]; drop one")
        else:
            seen[due] = j
    for j, step in enumerate(gate.escalate):
        path = f"{where}.escalate[{j}]"
        if step.after >= timeout:
            problems.append(
                f"{path}.after: {duration_text(int(step.after.total_seconds()))} is at or after the "
                f"gate's timeout ({limit}), so it could never happen; escalate earlier or raise the timeout"
            )
        known = ", ".join(sorted(channels))
        why = channel_problem(step.channel, f"{path}.channel", f"; name one of {known} or declare it")
        if why:
            problems.append(why)
        elif why is None:
            kind = channels[step.channel].type
            problems.extend(
                _approver_problems(step.approvers, f"{path}.approvers", kind, doc, channel=step.channel)
            )

    known = ", ".join(sorted(channels))
    why = channel_problem(gate.channel, f"{where}.channel", f"; name one of {known} or declare it")
    if why is not None:
        return [why, *problems] if why else problems
    kind = channels[gate.channel].type
    if identity_of(kind).one_by_one and not gate.approvers:
        whom = (
            "people with an email, or addresses"
            if identity_of(kind).by_email
            else f"people with their {kind} id"
        )
        problems.insert(
            0,
            f"{where}.approvers: the {kind} channel {gate.channel!r} sends each approver a message, "
            f"so the gate must list them ({whom})",
        )
    found = _approver_problems(gate.approvers, f"{where}.approvers", kind, doc, channel=gate.channel)
    return [*found, *problems]


def parse_config(raw: Any, *, source: str = "<config>") -> SignoffConfig:
    """Validate an already parsed YAML document."""
    problems: list[str] = []
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError([f"{source}: (top level): expected a mapping with channels, people and agents"])
    raw = _expand_env(raw, "", problems)
    if problems:  # what follows from an empty value would only mislead: fix the environment first
        raise ConfigError([f"{source}: {p}" for p in problems])
    try:
        doc = _File.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError([f"{source}: {p}" for p in _errors(exc, "", _File)]) from None

    channels: dict[str, ChannelConfig] = {
        "web": cast(ChannelConfig, CHANNEL_TYPES["web"].config.model_validate({"type": "web"}))
    }
    for name, body in doc.channels.items():
        kind = body.get("type")
        if kind not in CHANNEL_TYPES:
            known = ", ".join(sorted(CHANNEL_TYPES))
            problems.append(f"channels.{name}.type: unknown channel type {kind!r} (known: {known})")
            continue
        try:
            channels[name] = cast(ChannelConfig, CHANNEL_TYPES[kind].config.model_validate(body))
        except ValidationError as exc:
            problems.extend(_errors(exc, f"channels.{name}", CHANNEL_TYPES[kind].config))

    problems.extend(
        f"webhooks.{name}: a webhook's name is letters, digits, `.`, `_` and `-` (at most 200)"
        for name in doc.webhooks
        if not _WEBHOOK_NAME.match(name)
    )
    problems.extend(_ambiguous_people(doc.people))
    for agent, cfg in doc.agents.items():
        secret = Redactor({*doc.redact, *cfg.redact}).secret_key
        for i, gate in enumerate(cfg.hooks):
            if not isinstance(gate, ConfirmationGate):
                continue
            where = f"agents.{agent}.hooks[{i}]"
            for j, name in enumerate(gate.editable):
                if secret(name):
                    problems.append(
                        f"{where}.editable[{j}]: {name!r} is redacted (it holds a redact word), so "
                        "approvers never see its value and cannot change it; remove it from editable"
                    )
            problems.extend(_gate_problems(gate, where, channels, doc))

    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    redact = frozenset(k.lower() for k in doc.redact)
    config = SignoffConfig(
        channels=channels,
        people=doc.people,
        agents=doc.agents,
        redact=redact,
        source=source,
        operators=doc.operators,
        webhooks=doc.webhooks,
        console=doc.console,
    )
    return replace(config, version=config_version(config))


def _plain(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return {"secret": hashlib.sha256(value.get_secret_value().encode()).hexdigest()}
    if isinstance(value, BaseModel):
        return {k: _plain(v) for k, v in value.model_dump(mode="python", round_trip=True).items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)


def config_version(config: SignoffConfig) -> str:
    """A digest of the configuration's normalised content: equal files, equal versions, whatever
    their layout, comments or order; any change to a gate, a person, a channel or a secret
    gives another version (secrets enter it only as their own digests). Every request records
    the version it was gated under."""
    content = {
        "channels": {name: _plain(cfg) for name, cfg in config.channels.items()},
        "people": {name: _plain(p) for name, p in config.people.items()},
        "agents": {name: _plain(a) for name, a in config.agents.items()},
        "operators": {name: _plain(o) for name, o in config.operators.items()},
        "redact": sorted(config.redact),
    }
    if config.webhooks:  # absent from the digest when none: versions of files without stay as they were
        content["webhooks"] = {name: _plain(w) for name, w in config.webhooks.items()}
    if config.console != ConsoleConfig():  # likewise
        content["console"] = _plain(config.console)
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def load_config(path: Path | None) -> SignoffConfig:
    """Load and validate ``path``; no path means no agents and only the web channel."""
    if path is None:
        return parse_config({}, source="<default>")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the file: {exc.strerror or exc}"]) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError([f"{path}: {where}not valid YAML: {getattr(exc, 'problem', exc)}"]) from None
    return parse_config(raw, source=str(path))
