"""The one rule for tenant, user and queue names and run ids (worker/names.py), as the client,
the CLI, the HTTP API and the ledger apply it."""

from __future__ import annotations

from typing import Annotated, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field, TypeAdapter, ValidationError

from turnstile.errors import InvalidNameError
from turnstile.ledger.inputs import check_tenant as ledger_check_tenant
from turnstile.worker.http import apikeys, context, routes_limits, schemas
from turnstile.worker.names import (
    ENDPOINT_PATTERN,
    MAX_NAME_CHARS,
    NAME_PATTERN,
    QUEUE_PATTERN,
    RUN_ID_PATTERN,
    check_name,
    check_run_id,
)

ACCEPTED = {
    "tenant": ["acme", "t-1", "acme.eu", "acme:eu", "ops@acme", "_x", ".hidden", "a" * 128],
    "user": ["cu_ana", "ana@example.com", "u:42", "..x", "A" * 128],
    "queue": ["default", "q-1", "long.queue_name", "q" * 128],
    "endpoint": [
        "openai:gpt-4.1-mini",
        "anthropic:claude-sonnet-4-6",
        "ollama:llama3.1:8b",
        "local-vllm:meta-llama/Llama-3.1-8B-Instruct",
        "vertex:claude@20240620",
        "my_ep:m+x",
        "e" * 32 + ":" + "m" * 200,
    ],
}
REFUSED = {
    "tenant": ["", " ", "-acme", ".", "..", "a b", "{acme}", "café", "a/b", "a\n", "a" * 129],
    "user": ["", "-u", ".", "..", "cu ana", "u\x01", "u\n", "u" * 129],
    "queue": ["", "-q", ".", "..", "q:1", "q@x", "q 1", "q\n", "q" * 129],
    "endpoint": [
        "",
        "gpt-4",
        "OpenAI:gpt",
        "openai:",
        ":gpt",
        "-openai:gpt",
        "openai:gpt\x00",
        "openai:gpt\x1b[31m",
        "openai:a b",
        "openai:{x}",
        "openai:a|b",
        "openai:gpt\n",
        "e" * 33 + ":m",
        "openai:" + "m" * 201,
    ],
}
PATTERN = {"tenant": NAME_PATTERN, "user": NAME_PATTERN, "queue": QUEUE_PATTERN,
           "endpoint": ENDPOINT_PATTERN}  # fmt: skip


def _over_http(pattern: str, value: str) -> bool:
    """Whether pydantic, as the HTTP API's paths and bodies use it, takes `value`."""
    try:
        TypeAdapter(Annotated[str, Field(pattern=pattern)]).validate_python(value)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("kind", sorted(ACCEPTED))
def test_each_kind_takes_its_names_up_to_the_one_limit_and_refuses_the_rest(kind: str) -> None:
    """Tenants, users and queues share one limit (128 characters) and refuse a leading '-',
    "." and "..", whitespace and a trailing newline; a queue takes no ':' or '@'; a model
    endpoint is provider:model, with no control character, brace or '|'. The client's check
    and the HTTP API's pattern agree on every example."""
    assert MAX_NAME_CHARS == 128
    for name in ACCEPTED[kind]:
        assert check_name(kind, name) == name
        assert _over_http(PATTERN[kind], name), name
    for name in REFUSED[kind]:
        with pytest.raises(InvalidNameError) as refused:
            check_name(kind, name)
        assert "\n" not in str(refused.value)
        assert not _over_http(PATTERN[kind], name), name


def test_a_name_starting_with_a_dash_is_refused_as_such() -> None:
    """The refusal of `-acme` says why (the CLI's tests look for it), not the whole rule."""
    with pytest.raises(InvalidNameError, match="may not start with '-'"):
        check_name("tenant", "-acme")


@given(st.from_regex(NAME_PATTERN, fullmatch=True))
def test_every_tenant_the_worker_takes_the_ledger_takes(name: str) -> None:
    """The ledger checks its tenants itself, more loosely: none the worker accepts is refused
    there, and the API key commands take the same tenants as the client."""
    assert check_name("tenant", name) == name
    assert ledger_check_tenant(name) == name
    assert apikeys.check_tenant(name) == name


@given(st.text(alphabet="ab:@.-_ \n{", max_size=6))
def test_the_http_patterns_and_the_checks_are_one_rule(name: str) -> None:
    """For any short text, the HTTP API's tenant, user, queue and run id patterns accept it
    exactly when the client's checks do."""
    for kind in ("tenant", "queue"):
        try:
            check_name(kind, name)
            taken = True
        except InvalidNameError:
            taken = False
        assert _over_http(PATTERN[kind], name) is taken
    try:
        check_run_id(name)
        taken = True
    except InvalidNameError:
        taken = False
    assert _over_http(RUN_ID_PATTERN, name) is taken


def test_the_http_api_uses_the_rule() -> None:
    """The HTTP API's paths and bodies carry the rule's patterns, not copies of their own."""
    assert (context.NAME, context.QUEUE, context.RUN_ID) == (
        NAME_PATTERN,
        QUEUE_PATTERN,
        RUN_ID_PATTERN,
    )
    fields = schemas.SubmitBody.model_fields
    assert fields["user"].metadata[0].pattern == NAME_PATTERN
    assert fields["queue"].metadata[0].pattern == QUEUE_PATTERN
    assert get_args(routes_limits.EndpointPath)[1].metadata[0].pattern == ENDPOINT_PATTERN


RESERVED = ["unacked", "unacked_index", "unacked_mutex", "Unacked", "_kombu.binding.default",
            "_kombu.binding.celery.pidbox", "amq.gen-1", "celeryev", "celeryev.abc",
            "celery_delayed_27", "w1.celery.pidbox", "x.reply.celery.pidbox",
            "turnstile.q.default", "turnstile.anything"]  # fmt: skip
NEAR = ["unacked2", "kombu.binding", "amq", "celery", "celery-jobs", "pidbox", "turnstile",
        "my.turnstile.q"]  # fmt: skip


def test_queue_names_the_broker_reserves_are_refused_in_one_line() -> None:
    """kombu's own keys on a Redis broker, Celery's queues, RabbitMQ's `amq.` and Turnstile's
    namespace on the broker are no queue's name: one line saying the name is reserved; names
    that only resemble them are taken."""
    for name in RESERVED:
        with pytest.raises(InvalidNameError) as refused:
            check_name("queue", name)
        assert str(refused.value) == f"bad queue {name!r}: the name is reserved by the broker"
    for name in NEAR:
        assert check_name("queue", name) == name


def test_a_reserved_name_is_a_queue_rule_only() -> None:
    """A tenant, a user or a conversation key may be spelt like a broker's key: they are no
    key on the broker."""
    for kind in ("tenant", "user", "conversation"):
        assert check_name(kind, "unacked") == "unacked"
