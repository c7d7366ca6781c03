"""Declaring a tool from a plain function: its argument schema comes from the type hints, its
description from the docstring. The result is an ordinary `Tool`.

    @tool(mutates=True, reversible=False, charges={"refund_cents": "amount_cents"})
    def issue_refund(ctx: ToolContext, order_id: str, amount_cents: int) -> dict[str, Any]:
        "Refund part of an order."
        ...
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, overload

from turnstile.jobs.errors import JobDefinitionError
from turnstile.jobs.tools import Tool, ToolContext, ToolOutput

_SCALARS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    Any: {},
}


def schema_of(hint: Any) -> dict[str, Any]:
    """The JSON Schema of one argument's type hint; a hint it cannot express is an error."""
    if hint in _SCALARS:
        return dict(_SCALARS[hint])
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (types.UnionType, typing.Union):
        return {"anyOf": [schema_of(a) for a in args]}
    if origin in (list, tuple, set, frozenset) or hint in (list, tuple):
        item = args[0] if args and args[0] is not Ellipsis else Any
        return {"type": "array", "items": schema_of(item)}
    if origin in (dict, Mapping) or hint is dict:
        value = args[1] if len(args) == 2 else Any
        return {"type": "object", "additionalProperties": schema_of(value)}
    raise JobDefinitionError(f"no JSON Schema for the type hint {hint!r}")


def arguments_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The schema of a tool function's arguments: every parameter after the context."""
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError) as exc:  # a hint imported only under TYPE_CHECKING, say
        raise JobDefinitionError(
            f"tool {fn.__name__}: its type hints do not resolve: {exc}"
        ) from exc
    params = list(inspect.signature(fn).parameters.values())[1:]
    properties, required = {}, []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise JobDefinitionError(f"tool {fn.__name__}: argument {p.name} must be by name")
        properties[p.name] = schema_of(hints.get(p.name, Any))
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _wrap(fn: Callable[..., Any]) -> Callable[[ToolContext], ToolOutput]:
    def call(ctx: ToolContext) -> ToolOutput:
        out = fn(ctx, **ctx.args)
        return out if isinstance(out, ToolOutput) else ToolOutput(out)

    call.__name__ = fn.__name__
    return call


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(fn: None = None, /, **options: Any) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None, /, **options: Any
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a `Tool` of a function `fn(ctx, **arguments)` that returns a result mapping (or a
    ToolOutput). Options are Tool's fields: name, description, schema (written out instead of
    derived), mutates, reversible, cost_bound_microusd, timeout_s, facts, fact_scope, charges,
    key_args, done_text, open_text."""

    def make(f: Callable[..., Any]) -> Tool:
        fields = dict(options)
        fields.setdefault("name", f.__name__)
        fields.setdefault("description", inspect.getdoc(f) or "")
        if "schema" not in fields:
            fields["schema"] = arguments_schema(f)
        return Tool(fn=_wrap(f), **fields)

    return make(fn) if fn is not None else make
