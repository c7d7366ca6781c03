"""Declaring a tool from a plain function: its argument schema comes from the type hints, its
description from the docstring. The result is an ordinary `Tool`.

    @tool(mutates=True, reversible=False, charges={"refund_cents": "amount_cents"})
    def issue_refund(ctx: ToolContext, order_id: str, amount_cents: int) -> dict[str, Any]:
        "Refund part of an order."
        ...

A mistake in the declaration is a `JobDefinitionError` naming the tool and the fix, raised
when the module defining it is imported (so a job plugin holding it is shown broken by
`turnstile jobs`), never a surprise at the first call.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, overload

from turnstile.jobs.errors import JobDefinitionError
from turnstile.jobs.tools import RecordedFn, Tool, ToolContext

_SCALARS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    Any: {},
}
CONTEXT_NAMES = ("ctx", "context")  # an unannotated first parameter so named is the context


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


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except (NameError, TypeError) as exc:  # a hint imported only under TYPE_CHECKING, say
        raise JobDefinitionError(
            f"tool {fn.__name__}: its type hints do not resolve: {exc}"
        ) from exc


def _check_context(fn: Callable[..., Any], name: str, hints: Mapping[str, Any]) -> None:
    """A tool with context takes the ToolContext first: without this check a function written
    without it would silently take its first real argument as the context."""
    params = list(inspect.signature(fn).parameters.values())
    first = params[0] if params else None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    fix = (
        f"write `def {fn.__name__}(ctx: ToolContext, ...)`, or declare a tool that needs no "
        "context with `@tool(context=False)`"
    )
    if first is None or first.kind not in positional:
        raise JobDefinitionError(f"tool {name!r} takes no ToolContext first parameter: {fix}")
    hint = hints.get(first.name)
    if hint is None and first.name not in CONTEXT_NAMES:
        raise JobDefinitionError(
            f"tool {name!r}: its first parameter {first.name!r} is not annotated ToolContext: {fix}"
        )
    if hint is not None and hint is not ToolContext:
        shown = getattr(hint, "__name__", hint)
        raise JobDefinitionError(
            f"tool {name!r}: its first parameter {first.name!r} is {shown}, not the ToolContext: "
            f"{fix}"
        )


def arguments_schema(fn: Callable[..., Any], *, context: bool = True) -> dict[str, Any]:
    """The schema of a tool function's arguments: every parameter after the context (every
    parameter, for a tool declared with `context=False`)."""
    hints = _hints(fn)
    params = list(inspect.signature(fn).parameters.values())[1 if context else 0 :]
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


def _wrap(fn: Callable[..., Any], context: bool) -> Callable[[ToolContext], Any]:
    """The function as the kernel calls it: what it returns is its result, as is (a plain
    value or a ToolOutput); what it raises is the kernel's to observe."""

    def call(ctx: ToolContext) -> Any:
        return fn(ctx, **ctx.args) if context else fn(**ctx.args)

    call.__name__ = fn.__name__
    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def _names(value: object, option: str, name: str) -> tuple[str, ...]:
    """A sequence of names as a tuple; one bare string is the classic slip, refused."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise JobDefinitionError(
            f"tool {name!r}: {option} must be a tuple of names, e.g. {option}=({value!r},)"
        )
    return tuple(value)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    schema: Mapping[str, Any] | None = None,
    context: bool = True,
    mutates: bool = False,
    reversible: bool = True,
    cost_bound_microusd: int = 0,
    timeout_s: float = 30.0,
    facts: Sequence[str] = (),
    fact_scope: str | None = None,
    charges: Mapping[str, int | str] | None = None,
    key_args: Sequence[str] = (),
    done_text: str = "",
    open_text: str = "",
    recorded: RecordedFn | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    schema: Mapping[str, Any] | None = None,
    context: bool = True,
    mutates: bool = False,
    reversible: bool = True,
    cost_bound_microusd: int = 0,
    timeout_s: float = 30.0,
    facts: Sequence[str] = (),
    fact_scope: str | None = None,
    charges: Mapping[str, int | str] | None = None,
    key_args: Sequence[str] = (),
    done_text: str = "",
    open_text: str = "",
    recorded: RecordedFn | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a `Tool` of a function `fn(ctx: ToolContext, **arguments)` (or `fn(**arguments)`
    with `context=False`). It returns any JSON value, which the model sees as the call's
    result, or a `ToolOutput`; it raises `ToolError(code, detail)` for a failure the model
    should see (see `turnstile.jobs.tools` for the whole contract).

    Its name is the function's and its description the docstring (required: the model
    chooses tools by it), unless given. The arguments' schema is derived from the type hints,
    unless `schema` is written out. The other options are `Tool`'s fields: whether it
    `mutates`, whether that is `reversible`, its `cost_bound_microusd` and `timeout_s`, the
    result fields that become `facts` (prefixed with the value of the `fact_scope`
    argument), the job dimensions it `charges` (to a fixed bound or to the value of the
    named argument), the `key_args` that make up a write's idempotency key, the
    `done_text`/`open_text` of the closing message and the `recorded` check of a write.
    """

    def make(f: Callable[..., Any]) -> Tool:
        label: str = name or str(getattr(f, "__name__", "?"))
        if context:
            _check_context(f, label, _hints(f))
        args_schema = dict(schema) if schema is not None else arguments_schema(f, context=context)
        made = Tool(
            name=label,
            fn=_wrap(f, context),
            schema=args_schema,
            description=description if description is not None else inspect.getdoc(f) or "",
            mutates=mutates,
            reversible=reversible,
            cost_bound_microusd=cost_bound_microusd,
            timeout_s=timeout_s,
            facts=_names(facts, "facts", label),
            fact_scope=fact_scope,
            charges=dict(charges or {}),
            key_args=_names(key_args, "key_args", label),
            done_text=done_text,
            open_text=open_text,
            recorded=recorded,
        )
        if not made.description.strip():
            raise JobDefinitionError(
                f"tool {label!r} has no description: give {getattr(f, '__name__', 'it')} a "
                "docstring saying what it does (the model chooses tools by it), or "
                "@tool(description=...)"
            )
        return made

    return make(fn) if fn is not None else make
