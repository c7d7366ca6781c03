"""The Lua sources: headers document KEYS and ARGV; scripts are the library plus one file."""

from __future__ import annotations

import re

import pytest

from turnstile.ledger.scripts import OPERATIONS, compose, library_source, operation_source


@pytest.mark.parametrize("operation", OPERATIONS)
def test_each_operation_documents_its_keys_and_argv_at_the_top(operation: str) -> None:
    """Each operation file opens with a comment naming its KEYS and ARGV."""
    source = operation_source(operation)
    assert source.startswith("--[[")
    header = source[: source.index("]]")]
    assert "KEYS" in header and "ARGV" in header


@pytest.mark.parametrize("operation", OPERATIONS)
def test_operations_read_the_clock_once_through_ledger_now(operation: str) -> None:
    """Every operation takes its time from ledger_now (the server's TIME), once."""
    body = operation_source(operation).split("]]", 1)[1]
    assert body.count("ledger_now()") == 1
    assert "TIME" not in body


@pytest.mark.parametrize("operation", OPERATIONS)
def test_operations_name_no_key_of_their_own(operation: str) -> None:
    """Every key comes in through KEYS: no script builds a key name."""
    body = operation_source(operation).split("]]", 1)[1]
    assert "turnstile:" not in body and "'{" not in body


def test_a_script_is_the_library_then_the_operation() -> None:
    """Registration composes the shared library with one operation."""
    assert compose("settle") == library_source() + "\n" + operation_source("settle")


def test_the_library_documents_the_embedding_contract() -> None:
    """lib.lua states ledger_settle's keys, argv and replies at its top."""
    header = library_source()[: library_source().index("]]")]
    for word in ["ledger_settle(keys, argv)", "reservation_id", "'settled'", "'conflict'"]:
        assert word in header
    assert re.search(r"^local function ledger_settle\(keys, argv\)", library_source(), re.M)


def test_unknown_operation_is_refused() -> None:
    """Only the listed operations have scripts."""
    with pytest.raises(ValueError, match="no ledger operation"):
        operation_source("lib")
