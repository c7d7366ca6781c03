"""Property-based tests of the HTTP API from its own OpenAPI document, with schemathesis,
against a real `turnstile api` process on a server of its own: no input it describes, nor
inputs that break it, gets a 500, and what it answers conforms to what it documents, operation
by operation and along the links a client follows (submit -> read -> follow -> decide). And a
hypothesis fuzz of the two inputs a browser or a client echoes back: list cursors and
Last-Event-ID."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.core.transport import Response
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.apiserver import ApiServer, http, make_key, running_api
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.http.apikeys import Role
from turnstile.worker.http.schemas import WORD

pytestmark = pytest.mark.integration

# Fixed, so a failure is the same failure when run again; both are in docs/developing.md.
SEED = 17
EXAMPLES = 20  # per operation and mode, one operation at a time
STATEFUL_EXAMPLES = 80  # scenarios along the links, each up to STATEFUL_STEPS calls
STATEFUL_STEPS = 6
FUZZ_EXAMPLES = 200  # cursors, and stream ids, in the hypothesis fuzz
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
JOB = re.compile(WORD.removesuffix("$") + r"\Z")  # a job name the schema takes
SSE_READ_S = 2.0  # how long a followed stream is read before the fuzz hangs up


@pytest.fixture(scope="module")
def api_server() -> Iterator[tuple[ApiServer, str]]:
    """An API over a store of its own, so pausing whatever a generated name says touches no
    other test's queue; an operator key, so every operation is reachable."""
    with EmbeddedServer() as store:
        key = make_key(store.url, "fuzz", Role.OPERATOR, name="schemathesis")
        env = {
            "TURNSTILE_API_SUBMITS_PER_WINDOW": "100000",
            "TURNSTILE_API_SSE_BLOCK_MS": "100",  # a quiet stream says so within 0.1 s
        }
        with running_api(store.url, env) as server:
            yield server, key


EVENTS = "GET /v1/runs/{run_id}/events"


def _fuzz(operation: Any, mode: GenerationMode, key: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}

    @hypothesis.seed(SEED)
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def run(case: Any) -> None:
        if operation.label == EVENTS:
            case.validate_response(_follow_briefly(case, headers), checks=CHECKS)
        else:
            case.call_and_validate(headers=headers, checks=CHECKS, timeout=10)

    try:
        run()
    except Unsatisfiable:
        # An operation that takes nothing (/healthz) has no invalid input to make.
        assert mode is GenerationMode.NEGATIVE, operation.label


@pytest.mark.slow  # the schema fuzz: 50 s of one core, in the serial part
def test_no_generated_input_gets_a_server_error(api_server: tuple[ApiServer, str]) -> None:
    """Every operation of /openapi.json, with inputs that fit its schema and inputs that break
    it: never a 5xx, always a documented status code, content type and body, and every input
    that breaks the schema refused."""
    server, key = api_server
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    labels = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()  # the document itself is valid
        operation = result.ok()
        labels.append(operation.label)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(operation, mode, key)
    assert "POST /v1/runs" in labels and len(labels) >= 20


def _follow_briefly(case: Any, headers: dict[str, str]) -> Response:
    """GET a run's events as a client would, reading for at most SSE_READ_S (a run on a queue
    no worker reads never finishes), then hanging up: what was read is the response."""
    kwargs = case.as_transport_kwargs(headers=headers)
    started = time.monotonic()
    with requests.request(**kwargs, stream=True, timeout=10) as reply:
        body = b""
        if reply.status_code == 200:
            for line in reply.iter_lines():
                body += line + b"\n"
                if line.startswith(b":") or time.monotonic() - started > SSE_READ_S:
                    break  # a comment: the stream is quiet now, all there is was read
        else:
            body = reply.content
        reply._content = body  # what the checks read, instead of waiting for the end
        return Response.from_requests(reply, verify=True)


def _known_job(case: Any) -> None:
    """A client names a job its deployment runs: a submission's `job` that fits the schema
    becomes `support`, the job registered here (the API has no default job, and a made-up one
    is an unknown_job 422, so the links would never reach a run). A `job` that breaks the
    schema is left as generated, so a negative case stays negative."""
    body = case.body if case.operation.label == "POST /v1/runs" else None
    if isinstance(body, dict) and isinstance(body.get("job"), str) and JOB.match(body["job"]):
        body["job"] = "support"


@pytest.mark.slow  # 80 scenarios along the links: 20-odd s, in the serial part
def test_no_sequence_of_linked_calls_gets_a_server_error(
    api_server: tuple[ApiServer, str],
) -> None:
    """Along the OpenAPI links (submit -> read -> follow the events -> approve, deny or cancel),
    with inputs that fit and inputs that break the schema: never a 5xx, always a documented
    answer, and every broken input refused."""
    server, key = api_server
    headers = {"Authorization": f"Bearer {key}"}
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
    machine = schema.as_state_machine()
    followed: list[int] = []

    class Linked(machine):  # type: ignore[valid-type, misc]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": headers, "timeout": 10}

        def call(self, case: Any, **kwargs: Any) -> Any:
            _known_job(case)
            if case.operation.label == EVENTS:
                response = _follow_briefly(case, headers)
                followed.append(response.status_code)
                return response
            return case.call(**kwargs)

        def validate_response(
            self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            case.validate_response(response, checks=CHECKS)

    hypothesis.seed(SEED)(Linked)
    Linked.run(
        settings=settings(
            max_examples=STATEFUL_EXAMPLES, stateful_step_count=STATEFUL_STEPS, deadline=None,
            database=None, suppress_health_check=list(HealthCheck),
        )
    )  # fmt: skip
    assert 200 in followed  # the links reached a real run's events


# -- a fuzz of what clients echo back: cursors and stream ids ----------------------------------

PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
DIGITS = st.characters(categories=["Nd"])  # any script's digits
CURSORS = st.one_of(
    st.text(max_size=80),
    st.builds(lambda k, n, r: f"{k}{n}{r}", st.sampled_from(["s", "z", ""]),
              st.integers(-(2**70), 2**70), st.text(max_size=10)),
    st.builds(lambda d: f"z{d}:x", st.text(DIGITS, min_size=1, max_size=5)),
)  # fmt: skip
EVENT_IDS = st.one_of(
    st.text(PRINTABLE, max_size=45),
    st.builds(lambda a, b: f"{a}-{b}", st.integers(0, 2**70), st.integers(0, 2**70)),
    st.builds(lambda a, b: f"{a}-{b}", st.text(DIGITS, min_size=1, max_size=3),
              st.text(DIGITS, min_size=1, max_size=3)),
)  # fmt: skip


def _problem_or_page(reply: httpx.Response) -> None:
    assert reply.status_code < 500, reply.text
    if reply.status_code != 200:
        assert reply.headers["content-type"] == "application/problem+json", reply.text
        assert reply.json()["code"] and "\n" not in reply.json()["detail"]


def test_crafted_cursors_and_stream_ids_never_get_a_server_error(
    api_server: tuple[ApiServer, str],
) -> None:
    """Whatever a client sends as a list cursor (with and without a filter) or as a stream id
    (Last-Event-ID or ?after=) is a page, a stream that ends cleanly, or a one-line 4xx
    problem: never a 5xx, never a stream cut by an error."""
    server, _ = api_server
    with http(server, make_key(server.env["TURNSTILE_REDIS_URL"], "fuzz-tenant")) as web:
        made = web.post(
            "/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": "fuzz-idle"}
        )
        stopped = made.json()["run_id"]
        assert web.post(f"/v1/runs/{stopped}/cancel").status_code == 200
        events = f"/v1/runs/{stopped}/events"

        @hypothesis.seed(SEED)
        @given(cursor=CURSORS, status=st.sampled_from([None, "stopped", "running"]))
        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None)
        def cursors(cursor: str, status: str | None) -> None:
            params = {"cursor": cursor, **({"status": status} if status else {})}
            _problem_or_page(web.get("/v1/runs", params=params))

        @hypothesis.seed(SEED)
        @given(event_id=EVENT_IDS, by_header=st.booleans())
        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None)
        def stream_ids(event_id: str, by_header: bool) -> None:
            if by_header and event_id.isascii():
                reply = web.get(events, headers={"Last-Event-ID": event_id.strip()})
            else:
                reply = web.get(events, params={"after": event_id})
            _problem_or_page(reply)
            assert "event: error" not in reply.text

        cursors()
        stream_ids()
