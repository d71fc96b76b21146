"""How sure Signoff is of who cast a vote: one level per way a voter can be identified.

Every vote records the level it was cast at (``vote.assurance``); a gate's ``min_assurance``
refuses votes ranked below its level. Channels name theirs in their :class:`Identity`
(``Identity(assurance=Assurance.SLACK_SIGNED)``); operators' surfaces name theirs when they
cast the vote. Levels of one rank are equally strong: ``min_assurance: slack_signed`` takes a
``feishu_signed`` or ``teams_jwt`` vote as well.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ASSURANCE_RANKS", "Assurance", "assurance_rank", "below"]


class Assurance(StrEnum):
    """How a voter was identified (the values are stored and exported: never rename one)."""

    OIDC = "oidc"
    """Signed in to the console through the organisation's identity provider (OIDC)."""
    SLACK_SIGNED = "slack_signed"
    """A Slack click: the request signed with the app's signing secret, the user id Slack's."""
    FEISHU_SIGNED = "feishu_signed"
    """A Feishu click: the callback signed (or encrypted) with the app's keys, the open_id Feishu's."""
    TEAMS_JWT = "teams_jwt"
    """A Teams invoke: a Bot Framework JWT checked against Microsoft's keys, the aadObjectId Teams'."""
    CONSOLE_PASSWORD = "console_password"
    """Signed in to the console with an operator's password from the configuration."""
    CLI_TOKEN = "cli_token"
    """The command line against a running server, with a personal token its person created."""
    EMAIL_LINK = "email_link"
    """A single-use signed link mailed to the person's address (whoever holds the mail)."""
    NTFY_LINK = "ntfy_link"
    """A single-use signed action in an ntfy notification on the person's topic."""
    ADMIN_TOKEN = "admin_token"
    """The operator API with the server's admin token: the operator's name is the caller's word."""
    CLI_LOCAL = "cli_local"
    """The command line on the database itself (``--as NAME``): whoever can reach the database."""


ASSURANCE_RANKS: dict[Assurance, int] = {
    Assurance.OIDC: 4,
    # The platform authenticated the person (usually through the organisation's sign-in) and
    # signed the callback.
    Assurance.SLACK_SIGNED: 3,
    Assurance.FEISHU_SIGNED: 3,
    Assurance.TEAMS_JWT: 3,
    # A secret Signoff holds for that one person.
    Assurance.CONSOLE_PASSWORD: 2,
    Assurance.CLI_TOKEN: 2,
    # Possession of a message sent to the person: forwarded, it votes for them.
    Assurance.EMAIL_LINK: 1,
    Assurance.NTFY_LINK: 1,
    # The voter names themselves.
    Assurance.ADMIN_TOKEN: 0,
    Assurance.CLI_LOCAL: 0,
}
"""How strong each level is (higher: surer); each level has one."""


def assurance_rank(level: Assurance | str | None) -> int:
    """The rank of ``level``; an unknown or missing level (a vote recorded before levels
    were) ranks below every known one."""
    if level is None:
        return -1
    try:
        return ASSURANCE_RANKS[Assurance(level)]
    except ValueError:
        return -1


def below(level: Assurance | str | None, minimum: Assurance | str) -> bool:
    """Whether a vote at ``level`` falls short of a gate's ``minimum``."""
    return assurance_rank(level) < assurance_rank(minimum)
