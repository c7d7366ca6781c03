"""The checks that decide what goes to the dead letters, and how an entry is kept."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from turnstile.worker.broker.deadletters import MAX_RAW_BYTES, Reason, make
from turnstile.worker.broker.intake import header_problem
from turnstile.worker.broker.transport import envelope_problem


def good_envelope(**props: Any) -> dict[str, Any]:
    return {
        "body": base64.b64encode(b"[[], {}, {}]").decode(),
        "content-type": "application/json",
        "content-encoding": "utf-8",
        "headers": {"task": "turnstile.step", "id": "abc"},
        "properties": {
            "body_encoding": "base64", "delivery_tag": "t1", "priority": 0,
            "delivery_info": {"exchange": "q", "routing_key": "q"}, **props,
        },
    }  # fmt: skip


def test_a_producers_envelope_passes() -> None:
    """The envelope kombu's Redis transport writes has no problem."""
    assert envelope_problem(good_envelope()) is None


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ("just a string", "JSON str"),
        ([1, 2], "JSON list"),
        ({"body": "x"}, "no properties"),
        (good_envelope(delivery_tag=None), "no delivery tag"),
        (good_envelope(delivery_info="q"), "delivery_info"),
        (good_envelope(priority="high"), "priority"),
        ({**good_envelope(), "headers": ["task"]}, "headers is not an object"),
        ({**good_envelope(), "content-type": 7}, "content type"),
        ({**good_envelope(), "body": "%%%"}, "not base64"),
        ({**good_envelope(), "body": 12}, "not a string"),
        (good_envelope(body_encoding="rot13"), "unknown body encoding"),
    ],
)
def test_a_broken_envelope_is_named(payload: Any, problem: str) -> None:
    """Each way an entry can fail kombu's reads is caught before kombu reads it, and named."""
    found = envelope_problem(payload)
    assert found is not None and problem in found


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({"task": "t"}, "no task id"),
        ({"id": "a", "timelimit": "zz"}, "timelimit is not a pair"),
        ({"id": "a", "timelimit": [1, "2"]}, "timelimit holds"),
        ({"id": "a", "retries": -1}, "retries"),
        ({"id": "a", "eta": "tomorrow"}, "eta"),
        ({"id": "a", "expires": 5}, "expires"),
        ({"id": "a", "root_id": 5}, "root_id"),
    ],
)
def test_headers_that_would_break_celery_are_named(headers: dict[str, Any], problem: str) -> None:
    """Protocol-2 headers Celery's strategy or pool would raise on are caught and named; good
    ones (with a time limit pair and ISO times) pass."""
    found = header_problem(headers)
    assert found is not None and problem in found
    good = {"id": "a", "timelimit": [10, 20.5], "eta": "2026-01-01T00:00:00+00:00", "retries": 2}
    assert header_problem(good) is None


def test_an_entry_is_kept_as_text_or_base64_and_bounded() -> None:
    """Text stays text, other bytes are kept as base64, and a huge entry keeps its first
    MAX_RAW_BYTES with its whole size."""
    text = make("q", Reason.NOT_JSON, "x", "héllo")
    assert (text.raw, text.raw_encoding, text.truncated) == ("héllo", "text", False)
    binary = make("q", Reason.NOT_JSON, "x", b"\xff\x00")
    assert base64.b64decode(binary.raw) == b"\xff\x00" and binary.raw_encoding == "base64"
    huge = make("q", Reason.BAD_BODY, "d" * 1000, b"a" * (MAX_RAW_BYTES + 10))
    assert huge.truncated and huge.size_bytes == MAX_RAW_BYTES + 10
    assert len(huge.raw) == MAX_RAW_BYTES and len(huge.detail) < 1000
