"""The HTTP API's pure pieces: webhook signatures and backoff, idempotent run ids, the one run
id rule, strict stream ids and cursors, the budget body against the kernel's Budget, SSE
framing, one-line problem details."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import io
import json
import re

import httpx
import pytest
import structlog
from fastapi import FastAPI

from turnstile.backoff import backoff_s
from turnstile.errors import InvalidNameError
from turnstile.jobs.budget import Budget
from turnstile.worker.client._client import idempotent_run_id
from turnstile.worker.http import problems
from turnstile.worker.http.context import RUN_ID
from turnstile.worker.http.problems import Problem, one_line
from turnstile.worker.http.routes_webhooks import sign, verify
from turnstile.worker.http.schemas import BudgetBody, SubmitBody
from turnstile.worker.http.sse import _kind, check_event_id, frame
from turnstile.worker.names import RUN_ID_PATTERN, check_run_id
from turnstile.worker.ops.errors import ControlError
from turnstile.worker.ops.listing import decode_cursor, encode_cursor
from turnstile.worker.store.outbox import delivery_id
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


@pytest.mark.parametrize("run_id", [".", "..", "-x", "a\n", "x" * 129, "é", ""])
def test_one_run_id_rule_refuses_dot_segments_and_trailing_newlines(run_id: str) -> None:
    """The client, the CLI (through the client) and HTTP share one rule: "." and "..", a
    leading '-', a trailing newline, more than 128 characters or others are refused by each."""
    assert RUN_ID == RUN_ID_PATTERN == SubmitBody.model_fields["run_id"].metadata[0].pattern
    with pytest.raises(InvalidNameError):
        check_run_id(run_id)
    assert not re.fullmatch(RUN_ID, run_id)


def test_the_run_id_rule_keeps_every_other_id() -> None:
    """Dots are refused only as the whole id: "...", ".a" and "a." are run ids still."""
    for run_id in ("...", ".a", "..a", "a.", "a:b", "run_0f3a", "x" * 128, "." + "y" * 127):
        assert check_run_id(run_id) == run_id


@pytest.mark.parametrize(
    "value",
    ["18446744073709551616-0", "0-18446744073709551616", "\u0661-0", "1-\u00b2", "1700",
     "1-2\n", " 1-2", "1-2-3", "-1-0", "0x1-0"],
)  # fmt: skip
def test_a_stream_id_is_ascii_digits_and_each_part_a_uint64(value: str) -> None:
    """Anything a stream could not take as an id is a 400 problem before the stream starts."""
    with pytest.raises(Problem) as refused:
        check_event_id(value)
    assert (refused.value.status, refused.value.code) == (400, "invalid_event_id")


def test_the_largest_stream_ids_and_none_are_taken() -> None:
    """No id reads from the start; the largest uint64 parts are a stream id still."""
    top = f"{2**64 - 1}-{2**64 - 1}"
    assert (check_event_id(None), check_event_id(""), check_event_id(top)) == ("0-0", "0-0", top)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    ["s99999999999999999999999", "z\u00b2:x", _b64(b"[1e3,\"t\",\"r\"]"),
     _b64(json.dumps([2**53 + 1, "t", "r"]).encode()), _b64(b'[-1,"t","r"]'),
     _b64(b'[true,"t","r"]'), _b64(b'["1","t","r"]'), _b64(b'[1,"","r"]'),
     _b64(json.dumps([1, "t" * 129, "r"]).encode()), _b64(b'[1,"t"]'), "a" * 2201, "ab=="],
)  # fmt: skip
def test_a_cursor_is_parsed_strictly(cursor: str) -> None:
    """A cursor is url-safe base64 of [ms, tenant, run id]: out-of-range ms, wrong types,
    empty or overlong names, padding or other characters are refused, never passed on."""
    with pytest.raises(ControlError, match="bad cursor"):
        decode_cursor(cursor)


def test_a_cursor_a_listing_gives_is_read_back() -> None:
    """What encode_cursor gives, decode_cursor reads back as it was."""
    key = (2**53, "t" * 128, "r" * 128)
    assert decode_cursor(encode_cursor(key)) == key


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
