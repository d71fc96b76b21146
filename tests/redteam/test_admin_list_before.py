"""``GET /v1/admin/requests?before=`` pages the queue by creation time. A time without a zone
(``2026-05-01T12:00``, or a bare date) is UTC, as the command line and the console read it,
and a time whose UTC falls outside the years 1 to 9999 is a 422: neither is a 500."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from signoff.app.config import SignoffConfig
from tests.redteam.support import ADMIN, attack_config, pending, property_test, send

PROPERTY = property_test(40)


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


async def test_a_time_without_a_zone_is_utc(http: httpx.AsyncClient, agent_key: str) -> None:
    rid = await pending(http, agent_key, send())
    later = (datetime.now(UTC) + timedelta(hours=1)).replace(tzinfo=None)
    for before in (
        later.isoformat(timespec="seconds"),
        (later + timedelta(days=1)).date().isoformat(),
        "9999-12-31T23:59:59",
    ):
        r = await http.get("/v1/admin/requests", params={"before": before}, headers=ADMIN)
        assert r.status_code == 200, (before, r.status_code, r.text[:200])
        assert [q["id"] for q in r.json()] == [rid], before
    earlier = (datetime.now(UTC) - timedelta(hours=1)).replace(tzinfo=None).isoformat()
    r = await http.get("/v1/admin/requests", params={"before": earlier}, headers=ADMIN)
    assert r.status_code == 200, r.text[:200]
    assert r.json() == []


async def test_a_time_beyond_the_years_utc_holds_is_refused(http: httpx.AsyncClient) -> None:
    for before in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        r = await http.get("/v1/admin/requests", params={"before": before}, headers=ADMIN)
        assert r.status_code == 422, (before, r.status_code, r.text[:200])


ZONES = st.none() | st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)


@PROPERTY
@given(moment=st.datetimes(timezones=ZONES), date_only=st.booleans())
async def test_no_spelling_of_a_time_is_a_server_error(
    http: httpx.AsyncClient, moment: datetime, date_only: bool
) -> None:
    before = moment.date().isoformat() if date_only else moment.isoformat()
    r = await http.get("/v1/admin/requests", params={"before": before}, headers=ADMIN)
    assert r.status_code in (200, 422), (before, r.status_code, r.text[:200])
