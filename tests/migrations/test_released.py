"""Released migrations are append-only: each file is pinned by its SHA-256.

A database migrated by a release has run that release's files and will never run them
again: an edit to one reaches no database already past it (commit 6535b59 added a column to
0001, and databases made before were left without it). Change the schema with a new
revision instead (``alembic revision -m "..."`` after the last one), and pin it here once it
is released.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from signoff.app.db import MIGRATIONS, revisions

RELEASED = {
    "2026_11_30_1724-0001_initial_schema.py": (
        "f6fcd2ea718544e3fe1865c0d972f98554a2a208f9dd6bf8f10da56201855c47"
    ),
    "2026_11_30_1749-0002_switches_and_rate_buckets.py": (
        "b14a451d7b4d5f79e925e30fcbce28cd8bd0cc314d56b12e33efe24cb07386a0"
    ),
    "2026_11_30_1902-0003_index_decided_at.py": (
        "7c28835c9f77b5d4cfee641be8a69a94e42a97879c155ff944fa283b86555eb8"
    ),
    "2026_12_01_0903-0004_console_session_revocations.py": (
        "1eb2dddae39fdda8025c5458f3b7c5df38c1e25432eaae35a0d6371b7cf516fe"
    ),
    "2026_12_01_0940-0005_replicas.py": ("c23b882093c8fc6cce34af016214da40fca0d11509ab26690b8cff9577a2dfb9"),
    "2026_12_01_0945-0006_several_gates_per_request.py": (
        "a58c19c0bae82bcee74fb88c2721c77c870336738f97d6ebb1d2219daf7ac8b7"
    ),
    "2026_12_01_1138-0007_single_use_approvals_and_grants.py": (
        "c7a87c6ee030e904970eae47cecf31d2dac3157243c026d9ae41cdbde3ff23a6"
    ),
    "2026_12_01_1500-0008_approved_arguments.py": (
        "acc66e86a5009812c6c1b6f0763321c4555bcc13c5611f1e8d889c8e5734f779"
    ),
    "2026_12_01_1510-0009_webhook_deliveries.py": (
        "4715b901898256922d7135f409980228e86f0e53f9ca625cadfa5d74adb699b6"
    ),
    "2026_12_01_1520-0010_reminders_and_escalations.py": (
        "38038033ec5f89b8c03a01a7dabe5a0b03e531d416c5861c76f069285b47134e"
    ),
    "2026_12_02_0530-0011_call_digest_for_early_databases.py": (
        "7dc5aae9738a99d8d9c2bfd386e79cbf6e9a4b0be197e97effbe945b6ea61095"
    ),
    "2026_12_02_1500-0012_each_gate_snapshot_once.py": (
        "7ddaae0de3329602a83371a8bb5792e219551cc3776bf9729405b13590158ccb"
    ),
    "2026_12_02_1800-0013_signed_receipts.py": (
        "b43ba515b64f4f10ec84cfd90da540c95207718a9d59ef5b42c16654b9fdd679"
    ),
    "2026_12_02_1810-0014_vote_assurance.py": (
        "354283b9eacf001abfba811323533f3040ec43923f964ee546f06cd3e068957b"
    ),
    "2026_12_02_1820-0015_audit_chains.py": (
        "9883d129a5d5770ee57a8438c495919cc61d88b7b4419f4f6078477a025eff95"
    ),
    "2026_12_07_1800-0016_votes_under_subject.py": (
        "cc5144954b332397f45cee1a0155c8b91abbc221fbf2ab47dcc15d725542e99f"
    ),
    "2026_12_07_2300-0017_personal_tokens.py": (
        "1dc46279bcd3f17b5970567ebcc4fa7c5858ae32afd419aa2436385d82a041cb"
    ),
}
"""Each released migration file and the SHA-256 of its bytes as released."""

VERSIONS = MIGRATIONS / "versions"


def _files() -> dict[str, Path]:
    return {p.name: p for p in VERSIONS.glob("*.py") if p.name != "__init__.py"}


def test_no_released_migration_is_edited() -> None:
    edited = [
        f"{name} (sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}, released as {RELEASED[name]})"
        for name, path in sorted(_files().items())
        if name in RELEASED and hashlib.sha256(path.read_bytes()).hexdigest() != RELEASED[name]
    ]
    assert not edited, (
        f"released migrations were edited: {'; '.join(edited)}. Databases already past them never run "
        "them again: restore each (`git checkout -- migrations/versions/FILE`) and add a new migration "
        "for the change instead"
    )


def test_no_released_migration_is_removed() -> None:
    removed = sorted(set(RELEASED) - set(_files()))
    assert not removed, (
        f"released migrations were removed: {', '.join(removed)}; databases stamped with their "
        "revisions could no longer be upgraded: restore them"
    )


def test_every_migration_is_pinned() -> None:
    unpinned = sorted(set(_files()) - set(RELEASED))
    digests = ", ".join(f'"{n}": "{hashlib.sha256(_files()[n].read_bytes()).hexdigest()}"' for n in unpinned)
    assert not unpinned, (
        f"migrations not pinned in {__name__}.RELEASED: {', '.join(unpinned)}; once final, add {digests}"
    )


def test_the_history_is_one_line_of_the_pinned_revisions() -> None:
    assert len(revisions()) == len(RELEASED)
    assert [name.split("-", 1)[1][:4] for name in sorted(RELEASED)] == list(revisions())
