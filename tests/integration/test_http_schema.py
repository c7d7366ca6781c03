"""Property-based tests of the HTTP API from its own OpenAPI document, with schemathesis,
against a real `turnstile api` process on a server of its own: no input it describes, nor
inputs that break it, gets a 500, and what it answers conforms to what it documents."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance

from tests.integration.apiserver import ApiServer, make_key, running_api
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.http.apikeys import Role

pytestmark = pytest.mark.integration

EXAMPLES = 20  # per operation and mode: about 40 s in all on a busy 2-core machine


@pytest.fixture(scope="module")
def api_server() -> Iterator[tuple[ApiServer, str]]:
    """An API over a store of its own, so pausing whatever a generated name says touches no
    other test's queue; an operator key, so every operation is reachable."""
    with EmbeddedServer() as store:
        key = make_key(store.url, "fuzz", Role.OPERATOR, name="schemathesis")
        env = {"TURNSTILE_API_SUBMITS_PER_WINDOW": "100000"}
        with running_api(store.url, env) as server:
            yield server, key


def _fuzz(operation: Any, mode: GenerationMode, key: str) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def run(case: Any) -> None:
        case.call_and_validate(
            headers={"Authorization": f"Bearer {key}"},
            checks=[not_a_server_error, status_code_conformance, content_type_conformance],
            timeout=10,
        )

    try:
        run()
    except Unsatisfiable:
        # An operation that takes nothing (/healthz) has no invalid input to make.
        assert mode is GenerationMode.NEGATIVE, operation.label


def test_no_generated_input_gets_a_server_error(api_server: tuple[ApiServer, str]) -> None:
    """Every operation of /openapi.json, with inputs that fit its schema and inputs that break
    it: never a 5xx, always a documented status code and content type."""
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
