"""The HTTP API's pure pieces: webhook signatures and backoff, idempotent run ids, the budget
body against the kernel's Budget, SSE framing, one-line problem details."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import io
import re

import httpx
import structlog
from fastapi import FastAPI

from turnstile.jobs.budget import Budget
from turnstile.worker.http import problems
from turnstile.worker.http.context import RUN_ID
from turnstile.worker.http.problems import one_line
from turnstile.worker.http.routes_runs import idempotent_run_id
from turnstile.worker.http.routes_webhooks import sign, verify
from turnstile.worker.http.schemas import BudgetBody
from turnstile.worker.http.sse import _kind, frame
from turnstile.worker.http.webhook_delivery import backoff_s, delivery_id
from turnstile.worker.store.runs import encode_event


def test_a_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    """The signature header is v1=HMAC-SHA256(secret, "<timestamp>.<body>"), and verify
    refuses a changed body, timestamp or secret."""
    body = b'{"type":"run.finished"}'
    expected = hmac.new(b"whsec_s", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign("whsec_s", "1700000000", body) == f"v1={expected}"
    signature = sign("whsec_s", "1700000000", body)
    assert verify("whsec_s", "1700000000", body, signature)
    assert not verify("whsec_s", "1700000001", body, signature)
    assert not verify("whsec_s", "1700000000", body + b" ", signature)
    assert not verify("whsec_t", "1700000000", body, signature)


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    """Retries wait base, 2 base, 4 base ... and never more than the cap."""
    waits = [backoff_s(n, base_s=1.0, max_s=30.0) for n in range(1, 8)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_delivery_ids_are_one_per_endpoint_and_event() -> None:
    """The same endpoint and stream entry give the same delivery id; anything else another."""
    one = delivery_id("wh_1", "run_1", "1-0")
    assert one == delivery_id("wh_1", "run_1", "1-0")
    assert len({one, delivery_id("wh_2", "run_1", "1-0"), delivery_id("wh_1", "run_1", "2-0")}) == 3


def test_an_idempotency_key_names_one_run_per_tenant() -> None:
    """The same key of the same tenant is the same valid run id; another tenant's is not."""
    first = idempotent_run_id("acme", "order-1")
    assert first == idempotent_run_id("acme", "order-1")
    assert first != idempotent_run_id("globex", "order-1")
    assert first != idempotent_run_id("acme", "order-2")
    assert re.match(RUN_ID, first)


def test_the_budget_body_has_exactly_the_kernels_budget_fields() -> None:
    """Every Budget field can be set over HTTP, and no other: a field added to the kernel
    without the API is caught here, not answered as an unknown field."""
    assert set(BudgetBody.model_fields) == set(Budget.__struct_fields__)


def test_an_sse_frame_carries_the_top_level_type_and_the_stored_json() -> None:
    """The event name is the event's own type, not a nested one; the data is the stored JSON."""
    stored = encode_event({"type": "submitted", "state": {"plan": [{"type": "inner"}]}})
    assert stored.index('"type":"inner"') < stored.index('"type":"submitted"')
    assert _kind(stored) == "submitted"
    assert frame("17-0", "submitted", stored) == f"id: 17-0\nevent: submitted\ndata: {stored}\n\n"
    assert _kind("not json") == "message"


def test_a_problem_detail_is_one_short_line() -> None:
    """Whatever an error says, its detail is one line, cut to a bounded length."""
    assert one_line("a\nb\r\n  c") == "a b c"
    assert len(one_line("x" * 1000)) == 300


def test_an_unexpected_error_is_a_one_line_problem_not_a_traceback() -> None:
    """A bug in a route answers 500 as a problem document with one line, never a traceback,
    even when the log it would be written to is gone."""
    app = FastAPI()
    problems.install(app)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret internals\nline two")

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as web:
            return await web.get("/boom")

    gone = io.StringIO()
    gone.close()  # a log stream that is gone must not cost the answer
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(gone))
    try:
        reply = asyncio.run(call())
    finally:
        structlog.reset_defaults()
    assert reply.status_code == 500
    assert reply.headers["content-type"] == "application/problem+json"
    assert reply.json()["code"] == "internal" and "secret" not in reply.text
