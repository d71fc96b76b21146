from __future__ import annotations

import inspect
from typing import Any

import httpx
import pytest

from signoff.hooks._gate import key_digest
from signoff.hooks.client import AsyncGateClient, GateClient, GateDenied, GateTimeout, GateUnavailable
from signoff.hooks.decorator import agated, call_key, gate, gated
from tests.hooks.signoff_fakes import KEY, URL, Scripted, pending, state, submitted

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05}


def sync_client(fake: Scripted, **kwargs: Any) -> GateClient:
    return GateClient(URL, KEY, transport=httpx.MockTransport(fake), **{**FAST, **kwargs})


def async_client(fake: Scripted, **kwargs: Any) -> AsyncGateClient:
    return AsyncGateClient(URL, KEY, transport=httpx.MockTransport(fake), **{**FAST, **kwargs})


def test_allowed_call_runs_with_its_arguments_sent() -> None:
    fake = Scripted().on("submit", submitted("allow"))
    ran: list[tuple[str, int, str]] = []

    @gate(sync_client(fake), session_id="s-1", metadata={"source": "batch"})
    def pay_invoice(invoice_id: str, amount: int, currency: str = "EUR") -> str:
        """Pay one invoice."""
        ran.append((invoice_id, amount, currency))
        return "paid"

    assert pay_invoice("inv-1", amount=70_000) == "paid"
    assert ran == [("inv-1", 70_000, "EUR")]
    (body,) = fake.bodies()
    assert body["tool_name"] == "pay_invoice"
    assert body["arguments"] == {"invoice_id": "inv-1", "amount": 70_000, "currency": "EUR"}
    assert body["session_id"] == "s-1"
    assert body["metadata"] == {"source": "batch"}
    assert pay_invoice.__name__ == "pay_invoice"
    assert pay_invoice.__doc__ == "Pay one invoice."


def test_denied_call_raises_and_never_runs() -> None:
    fake = (
        Scripted().on("submit", pending("req-1")).on("wait", state("req-1", "rejected", reason="over budget"))
    )
    ran: list[int] = []

    @gate(sync_client(fake), action="payments.pay")
    def pay(amount: int) -> None:
        ran.append(amount)

    with pytest.raises(GateDenied, match="over budget") as info:
        pay(5)
    assert type(info.value) is GateDenied
    assert info.value.request_id == "req-1"
    assert ran == []
    assert fake.bodies()[0]["tool_name"] == "payments.pay"


def test_server_down_raises_unavailable_which_is_a_denial() -> None:
    fake = Scripted().on("submit", httpx.ConnectError("refused"))
    ran: list[int] = []

    @gate(sync_client(fake), deadline=0.2)
    def pay(amount: int) -> None:
        ran.append(amount)

    with pytest.raises(GateUnavailable):
        pay(5)
    with pytest.raises(GateDenied):
        pay(5)
    assert ran == []


def test_timeout_and_poll_settings_are_used() -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", state("req-1"))

    @gate(sync_client(fake), deadline=0.3, poll_timeout=4)
    def pay(amount: int) -> None:
        raise AssertionError("must not run")

    with pytest.raises(GateTimeout):
        pay(1)
    # The server is asked to answer within the time left, so the answer can still arrive.
    asked = float(fake.sent("wait")[0].url.params["timeout"])
    assert 0 < asked < 0.3, "poll time is capped by the time left"

    fake2 = Scripted().on("submit", pending("req-1")).on("wait", state("req-1", "approved"))

    @gate(sync_client(fake2), deadline=30, poll_timeout=4)
    def pay2(amount: int) -> str:
        return "ok"

    assert pay2(1) == "ok"
    assert fake2.sent("wait")[0].url.params["timeout"] == "4"


def test_a_key_given_always_carries_a_digest_of_the_call() -> None:
    fake = Scripted().on("submit", submitted("allow"))
    client = sync_client(fake)

    @gate(client, key=lambda invoice_id, amount: f"pay:{invoice_id}")
    def pay(invoice_id: str, amount: int) -> None:
        pass

    @gate(client, key="fixed-key")
    def other() -> None:
        pass

    pay("inv-9", 3)
    pay("inv-9", 3)
    pay("inv-9", 90_000)
    other()
    keys = [b["idempotency_key"] for b in fake.bodies()]
    assert keys[0] == keys[1] == f"pay:inv-9:{key_digest('pay', {'invoice_id': 'inv-9', 'amount': 3})}"
    assert keys[2] == call_key("pay:inv-9", "pay", {"invoice_id": "inv-9", "amount": 90_000})
    assert keys[2] != keys[0], "other arguments, another call: one approval never covers both"
    assert keys[3] == call_key("fixed-key", "other", {})
    # The digest is of the canonical call: the order the arguments come in does not matter.
    assert call_key("k", "pay", {"a": 1, "b": [1, 2]}) == call_key("k", "pay", {"b": [1, 2], "a": 1})
    assert call_key("k", "pay", {"a": 1}) != call_key("k", "pay_invoice", {"a": 1})


def test_without_a_key_every_call_gets_a_fresh_one() -> None:
    fake = Scripted().on("submit", submitted("allow"))

    @gate(sync_client(fake))
    def pay(amount: int) -> None:
        pass

    pay(1)
    pay(1)
    first, second = (b["idempotency_key"] for b in fake.bodies())
    assert first.startswith("python:auto:")
    assert first != second


def test_an_executed_call_is_reported_under_its_key() -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", state("req-1", "approved"))

    @gate(sync_client(fake), key="billing:inv-1", session_id="s-1", user_id="u-1", metadata={"job": "b"})
    def pay(invoice_id: str, amount: int) -> dict[str, Any]:
        return {"paid": amount}

    assert pay("inv-1", 90_000) == {"paid": 90_000}
    asked, again = fake.bodies()
    assert again == asked, "sent again as it was, once approved"
    (report,) = fake.bodies("report")
    assert report["idempotency_key"] == asked["idempotency_key"]
    assert report["tool_name"] == "pay"
    assert report["arguments"] == {"invoice_id": "inv-1", "amount": 90_000}
    assert report["result"] == {"paid": 90_000}
    assert (report["session_id"], report["user_id"], report["metadata"]) == ("s-1", "u-1", {"job": "b"})
    assert "error" not in report


def test_a_call_that_raises_is_reported_with_the_error_and_the_error_goes_on() -> None:
    fake = Scripted().on("submit", submitted("allow"))

    @gate(sync_client(fake))
    def pay(amount: int) -> None:
        raise ValueError("card declined")

    with pytest.raises(ValueError, match="card declined"):
        pay(5)
    (report,) = fake.bodies("report")
    assert report["error"] == "ValueError: card declined"
    assert report["idempotency_key"] == fake.bodies()[0]["idempotency_key"]


def test_a_lost_report_never_fails_the_call() -> None:
    fake = Scripted().on("submit", submitted("allow")).on("report", httpx.Response(401))

    @gate(sync_client(fake))
    def pay(amount: int) -> str:
        return "paid"

    assert pay(5) == "paid"
    assert len(fake.sent("report")) == 1


def test_a_denied_call_is_not_reported() -> None:
    fake = Scripted().on("submit", submitted("deny", reason="no"))

    @gate(sync_client(fake))
    def pay(amount: int) -> None:
        raise AssertionError("must not run")

    with pytest.raises(GateDenied):
        pay(5)
    assert fake.sent("report") == []


def test_rewritten_arguments_replace_the_call_arguments() -> None:
    fake = Scripted().on("submit", submitted("allow", modified_arguments={"amount": 100}))
    seen: list[tuple[str, int]] = []

    @gate(sync_client(fake))
    def pay(invoice_id: str, amount: int) -> None:
        seen.append((invoice_id, amount))

    pay("inv-1", 100_000)
    assert seen == [("inv-1", 100)]
    (report,) = fake.bodies("report")
    assert report["arguments"] == {"invoice_id": "inv-1", "amount": 100}, "the arguments it ran with"


def test_a_rewrite_the_function_cannot_take_refuses_the_call() -> None:
    fake = Scripted().on("submit", submitted("allow", modified_arguments={"surprise": 1}))
    ran: list[int] = []

    @gate(sync_client(fake))
    def pay(amount: int) -> None:
        ran.append(amount)

    with pytest.raises(
        GateUnavailable, match=r"only with arguments it does not take \(surprise: \(none\) → 1\)"
    ):
        pay(1)
    assert ran == []
    assert fake.sent("report") == []


def test_methods_do_not_send_self() -> None:
    fake = Scripted().on("submit", submitted("allow", modified_arguments={"path": "/tmp/x"}))
    client = sync_client(fake)

    class Files:
        @gate(client)
        def delete(self, path: str) -> str:
            return f"{type(self).__name__} deleted {path}"

    assert Files().delete("/etc") == "Files deleted /tmp/x"
    assert fake.bodies()[0]["arguments"] == {"path": "/etc"}


def test_var_args_are_sent_and_rewritten() -> None:
    fake = Scripted().on(
        "submit", submitted("allow", modified_arguments={"paths": ["/a"], "options": {"f": 1}})
    )
    seen: list[Any] = []

    @gate(sync_client(fake))
    def rm(*paths: str, **options: int) -> None:
        seen.append((paths, options))

    rm("/a", "/b", force=1)
    assert fake.bodies()[0]["arguments"] == {"paths": ["/a", "/b"], "options": {"force": 1}}
    assert seen == [(("/a",), {"f": 1})]
    assert fake.bodies("report")[0]["arguments"] == {"paths": ["/a"], "options": {"f": 1}}


def test_sync_function_with_async_client_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="needs a GateClient"):

        @gate(async_client(Scripted()))
        def pay() -> None:
            pass


async def test_async_function_with_async_client() -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", state("req-1", "approved"))
    ran: list[int] = []

    @gate(async_client(fake))
    async def pay(amount: int) -> str:
        ran.append(amount)
        return "paid"

    assert inspect.iscoroutinefunction(pay)
    assert await pay(3) == "paid"
    assert ran == [3]
    (report,) = fake.bodies("report")
    assert (report["idempotency_key"], report["result"]) == (fake.bodies()[0]["idempotency_key"], "paid")


async def test_async_function_denied() -> None:
    fake = Scripted().on("submit", submitted("deny", reason="frozen"))
    ran: list[int] = []

    @gate(async_client(fake))
    async def pay(amount: int) -> None:
        ran.append(amount)

    with pytest.raises(GateDenied, match="frozen"):
        await pay(3)
    assert ran == []


async def test_async_function_with_sync_client() -> None:
    fake = Scripted().on("submit", submitted("allow"))

    @gate(sync_client(fake))
    async def pay(amount: int) -> int:
        return amount * 2

    assert await pay(21) == 42
    assert fake.bodies()[0]["arguments"] == {"amount": 21}
    assert fake.bodies("report")[0]["result"] == 42


async def test_async_function_that_raises_is_reported() -> None:
    fake = Scripted().on("submit", submitted("allow"))

    @gate(async_client(fake))
    async def pay(amount: int) -> None:
        raise RuntimeError("gateway down")

    with pytest.raises(RuntimeError):
        await pay(3)
    assert fake.bodies("report")[0]["error"] == "RuntimeError: gateway down"


def test_gated_runs_the_body_only_when_allowed() -> None:
    fake = Scripted().on("submit", submitted("allow", modified_arguments={"table": "users_tmp"}))
    client = sync_client(fake)
    ran: list[str] = []
    with gated(client, "drop_table", {"table": "users"}, idempotency_key="drop:users") as decision:
        ran.append(decision.arguments({"table": "users"})["table"])
    assert ran == ["users_tmp"]
    key = call_key("drop:users", "drop_table", {"table": "users"})
    assert fake.bodies()[0]["idempotency_key"] == key
    (report,) = fake.bodies("report")
    assert (report["idempotency_key"], report["arguments"]) == (key, {"table": "users_tmp"})

    fake.scripts["submit"] = [submitted("deny", reason="no drops on Fridays")]
    with pytest.raises(GateDenied, match="Fridays"), gated(client, "drop_table", {"table": "users"}):
        ran.append("ran anyway")
    assert ran == ["users_tmp"]
    assert len(fake.sent("report")) == 1, "a call that did not run is not reported"

    fake.scripts["submit"] = [submitted("allow")]
    with pytest.raises(OSError, match="disk"), gated(client, "drop_table", {"table": "t"}):
        raise OSError("disk full")
    assert fake.bodies("report")[1]["error"] == "OSError: disk full"


async def test_agated_runs_the_body_only_when_allowed() -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", state("req-1", "approved"))
    client = async_client(fake)
    ran: list[str] = []
    async with agated(client, "drop_table", {"table": "users"}, session_id="s", tool_call_id="c") as decision:
        ran.append(decision.request_id or "")
    assert ran == ["req-1"]
    assert fake.bodies()[0]["idempotency_key"] == "python:s:c"
    (report,) = fake.bodies("report")
    assert (report["idempotency_key"], report["tool_call_id"]) == ("python:s:c", "c")

    fake.scripts["submit"] = [pending("req-2")]
    fake.scripts["wait"] = [state("req-2")]
    with pytest.raises(GateTimeout):
        async with agated(client, "drop_table", {"table": "users"}, deadline=0.2):
            ran.append("ran anyway")
    assert ran == ["req-1"]
