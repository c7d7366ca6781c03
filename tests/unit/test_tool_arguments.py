"""A tool's argument check: the plain predicate a simple schema compiles to (`_fast_check`)
never lets through what the JSON Schema validator refuses, a tool's validator and predicate
are its own schema's (two tools of one name and other schemas are not confused), and invalid
arguments are told with the validator's own messages."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from turnstile.jobs.tools import Tool, ToolContext

ORDER = {"type": "string", "minLength": 1, "maxLength": 8}
SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "order_id": ORDER,
            "amount_cents": {"type": "integer", "minimum": 1, "maximum": 1000},
            "reason": {"type": "string", "maxLength": 5},
        },
        "required": ["order_id", "amount_cents"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "kind": {"type": "string", "enum": ["a", "bb"]},
            "ratio": {"type": "number", "minimum": -1.5, "maximum": 2.5},
            "on": {"type": "boolean"},
        },
        "required": ["kind"],
    },
    {"type": "object", "properties": {}, "additionalProperties": False},
]

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=1005),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "a", "bb", "abcdefghi", "ab", "x" * 8]),
    st.lists(st.integers(), max_size=2),
)
arguments = st.one_of(
    st.dictionaries(
        st.sampled_from(["order_id", "amount_cents", "reason", "kind", "ratio", "on", "other"]),
        values,
        max_size=5,
    ),
    values,
)


def _fn(ctx: ToolContext) -> None:
    return None


@settings(max_examples=600, deadline=None)
@given(index=st.integers(min_value=0, max_value=len(SCHEMAS) - 1), args=arguments)
def test_the_predicate_passes_only_what_the_validator_passes(index: int, args: Any) -> None:
    schema = SCHEMAS[index]
    tool = Tool("t", _fn, schema)
    valid = Draft202012Validator(schema).is_valid(args)
    assert (tool.argument_problems(args) == []) is valid
    check = tool._surely_valid
    assert check is not None, "each of these schemas is a simple one"
    if check(args):
        assert valid, f"the predicate let through {args!r}, which the validator refuses"


def test_usual_valid_arguments_take_the_plain_check() -> None:
    tool = Tool("t", _fn, SCHEMAS[0])
    assert tool._surely_valid is not None
    assert tool._surely_valid({"order_id": "o1", "amount_cents": 5})
    assert tool.argument_problems({"order_id": "o1", "amount_cents": 5, "reason": "ok"}) == []


def test_a_schema_it_cannot_compile_is_left_to_the_validator() -> None:
    nested = {"type": "object", "properties": {"at": {"type": "string", "format": "date"}}}
    union = {"type": "object", "properties": {"n": {"anyOf": [{"type": "integer"}]}}}
    pattern = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}}
    for schema in (nested, union, pattern):
        assert Tool("t", _fn, schema)._surely_valid is None
    tool = Tool("t", _fn, pattern)
    assert tool.argument_problems({"s": "abc"}) == []
    assert tool.argument_problems({"s": "b"}) == ["s: 'b' does not match '^a'"]


def test_two_tools_of_one_name_keep_their_own_schemas() -> None:
    """The validator and the predicate are cached by the schema, never by the tool's name: a
    schema changed between two tools is not confused with the other."""
    properties = {**SCHEMAS[0]["properties"], "amount_cents": {"type": "integer", "maximum": 10}}
    small = Tool("refund", _fn, {**SCHEMAS[0], "properties": properties})
    large = Tool("refund", _fn, SCHEMAS[0])
    args = {"order_id": "o1", "amount_cents": 500}
    assert large.argument_problems(args) == []
    assert small.argument_problems(args) == ["amount_cents: 500 is greater than the maximum of 10"]
    assert large.argument_problems(args) == []


def test_invalid_arguments_say_what_the_validator_says() -> None:
    tool = Tool("t", _fn, SCHEMAS[0])
    assert tool.argument_problems({"order_id": "", "amount_cents": 0, "x": 1}) == [
        "arguments: Additional properties are not allowed ('x' was unexpected)",
        "amount_cents: 0 is less than the minimum of 1",
        "order_id: '' should be non-empty",
    ]
    assert tool.argument_problems({"amount_cents": True}) == [
        "arguments: 'order_id' is a required property",
        "amount_cents: True is not of type 'integer'",
    ]
    assert tool.argument_problems("x") == ["arguments: 'x' is not of type 'object'"]
