"""Tools as the kernel sees them: declared contracts, validated arguments, bounded calls.

A tool declares its argument schema, whether it mutates, whether that can be undone, a cost
bound, a timeout, and which result fields may become facts. None of this is inferred from the
tool's name, and the model cannot change any of it.

What a tool gives back (the result contract):

- any JSON value (a dict, a list, a string, a number, a bool, None) is a plain value: the
  observation `{"status": "ok", "result": <value>}`; its fields named in `facts` become facts;
- `raise ToolError(code, detail)`: a failure the model should see, `{"status": "error",
  "code": ..., "detail": ...}`, as an error result would be;
- any other exception: `{"status": "error", "code": "tool_raised", "detail": "<Type>: <message>"}`,
  logged once with its traceback; it counts toward the run's `tool_failure`;
- a `ToolOutput`: the status envelope, for what a plain value cannot say (`needs_approval`, an
  `unknown` outcome, the latency, cost and charges it reports);
- anything else (a set, a datetime, an object, more than MAX_RESULT_BYTES): `bad_result` with a
  one-line reason, and nothing of the value is kept.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from turnstile.jobs.errors import JobDefinitionError, KernelError
from turnstile.jobs.live import MAX_NOTE_CHARS, NO_LIVE, LiveSink

MAX_RESULT_BYTES = 256 * 1024  # a result bigger than this is refused rather than carried in state
MAX_RESULT_DEPTH = 64  # nesting beyond this is refused: no reader should have to recurse deeper
RESULT_STATUSES = frozenset({"ok", "error", "needs_approval", "unknown"})
PERMANENT_CODES = frozenset({"not_found", "invalid_state", "forbidden"})  # retrying cannot help
MAX_CODE_CHARS = 64
MAX_DETAIL_CHARS = 200  # what a view or a log line shows of a reason: one bounded line


def one_line(text: object, limit: int = MAX_DETAIL_CHARS) -> str:
    """Text as one line of at most `limit` characters (cut with an ellipsis)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class ToolError(KernelError):
    """Raised by a tool for a failure the model should see and may act on:
    `raise ToolError("not_found", f"no order {order_id}")`.

    The call's observation is `{"status": "error", "code": code, "detail": detail}`, exactly as
    a `ToolOutput` error result would be; `detail` is any JSON value (other values are shown
    as text). The codes `not_found`, `invalid_state` and `forbidden` mark the call's plan step
    failed (retrying cannot help). Unlike any other exception, it is not logged and does not
    count toward the run's `tool_failure`: the tool worked and said no.
    """

    def __init__(self, code: str, detail: Any = None) -> None:
        super().__init__(code if detail is None else f"{code}: {detail}")
        self.code, self.detail = code, detail


@dataclass(frozen=True)
class ToolContext:
    """What a tool call is given, as the first argument of a `@tool` function. The identity
    (run, tenant, user) comes from the run, never from the model; `args` are the call's
    arguments, already checked against the tool's schema; `key` is the idempotency key of the
    call (the same logical write always carries the same key); `timeout_s` is how long the
    call may take (the tool's timeout or the run's remaining time, whichever is less);
    `approved` says a person approved exactly this call."""

    run_id: str
    tenant: str
    user_id: str
    params: Mapping[str, Any]
    args: Mapping[str, Any]
    key: str  # idempotency key: the same logical call always carries the same key
    timeout_s: float
    approved: bool = False  # a person approved exactly this call (name and arguments)
    # Where the call's progress notes go while the turn runs (jobs/live.py), and the call's
    # span id and tool name that tag them; not part of the call's identity.
    live: LiveSink = field(default=NO_LIVE, compare=False, repr=False)
    call: str = field(default="", compare=False, repr=False)
    tool: str = field(default="", compare=False, repr=False)

    def progress(self, note: str) -> None:
        """Tell whoever watches the run live how far the call got (one line, at most 500
        characters); the run's state and its events do not keep it."""
        self.live.progress(self.call, self.tool, " ".join(str(note).split())[:MAX_NOTE_CHARS])


@dataclass(frozen=True)
class ToolOutput:
    """The status envelope, for a tool that must say more than a plain value can.

    `result` is a mapping whose `status` is `ok`, `error` (with a string `code`),
    `needs_approval` (the call is held for a person, and run again under the same key when
    approved) or `unknown` (a write whose effect cannot be known: the run ends
    `unknown_outcome`). A tool may also report the latency, the cost and the job-dimension
    charges it actually had; the declared bounds are used otherwise. A tool that returns
    anything but a ToolOutput returns a plain value (see the module's contract)."""

    result: Any
    latency_s: float | None = None  # reported (simulated) latency; measured when None
    cost_microusd: int | None = None  # actual cost; the declared bound when None
    charges: Mapping[str, int] | None = None  # actual job-dimension charges; the bounds when None


ToolFn = Callable[[ToolContext], Any]  # a plain value, a ToolOutput, or it raises
# For a write: did it take effect under this idempotency key? Asked with the run's context
# (run id, tenant, user, params; `key` the step's idempotency key, no arguments), so a system
# of record kept per tenant is read in the run's own. Read-only; it lets a closing message say
# what the world recorded.
RecordedFn = Callable[[ToolContext], bool]


@dataclass(frozen=True, eq=False)
class Tool:
    """One tool as the kernel runs it: its function, the JSON Schema of its arguments and its
    declared contract. `@tool` makes one from a plain function; a Tool written out by hand
    takes `fn(ctx)` and reads the arguments from `ctx.args`."""

    name: str
    fn: ToolFn
    schema: Mapping[str, Any]  # JSON Schema (2020-12) of the arguments, checked before a call
    description: str = ""  # what the tool does, for the model's adapter
    mutates: bool = False
    reversible: bool = True
    cost_bound_microusd: int = 0
    timeout_s: float = 30.0
    facts: tuple[str, ...] = ()  # result fields that may become facts
    fact_scope: str | None = None  # argument whose value prefixes the fact names
    done_text: str = ""  # for the closing message: what a done step achieved
    open_text: str = ""  # and what a step that is not done did not
    # Job ledger dimensions this tool charges, each to the bound reserved before the call: an
    # integer, or the name of an integer argument whose value is the bound (refund_cents ->
    # "amount_cents"). The tool reports what it actually charged in ToolOutput.charges.
    charges: Mapping[str, int | str] = field(default_factory=dict)
    # Arguments that make up the idempotency key of a write: the same values are the same
    # write, whatever the turn. Empty: one key per plan step (or per turn and position).
    key_args: tuple[str, ...] = ()
    recorded: RecordedFn | None = None  # a write's system of record, asked by key
    _validator: Draft202012Validator = field(init=False, repr=False)
    # A plain predicate for a simple schema (jobs/tools.py `_fast_check`): True only when
    # the arguments surely pass; anything else is asked of the validator.
    _surely_valid: Callable[[Any], bool] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            canonical = msgspec.json.encode(self.schema, order="sorted").decode()
            validator = _validator(canonical)
        except (SchemaError, TypeError, ValueError) as exc:
            message = getattr(exc, "message", str(exc))
            raise JobDefinitionError(
                f"tool {self.name!r}: its schema is not valid JSON Schema: {message}"[:300]
            ) from exc
        object.__setattr__(self, "_validator", validator)
        object.__setattr__(self, "_surely_valid", _fast_check(canonical))
        for dimension, bound in self.charges.items():
            if not isinstance(bound, int | str) or isinstance(bound, bool):
                raise JobDefinitionError(
                    f"tool {self.name!r}: the bound of {dimension!r} must be an integer or "
                    "the name of an integer argument"
                )
        self._check_options()

    def _check_options(self) -> None:
        """Options of the wrong type, and names that are not the tool's arguments, are refused
        here: each would otherwise be found (or silently ignored) at a call."""
        name = self.name
        for option, want in (("mutates", bool), ("reversible", bool)):
            if not isinstance(getattr(self, option), want):
                raise JobDefinitionError(f"tool {name!r}: {option} must be True or False")
        cost = self.cost_bound_microusd
        if not isinstance(cost, int) or isinstance(cost, bool) or cost < 0:
            raise JobDefinitionError(
                f"tool {name!r}: cost_bound_microusd must be a whole number of micro-dollars "
                f">= 0, got {cost!r}"
            )
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise JobDefinitionError(f"tool {name!r}: timeout_s must be seconds > 0")
        for option in ("facts", "key_args"):
            value = getattr(self, option)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise JobDefinitionError(
                    f"tool {name!r}: {option} must be a tuple of names, e.g. {option}=('x',)"
                )
        arguments = self.schema.get("properties")
        known = sorted(arguments) if isinstance(arguments, Mapping) else []
        named = [("key_args", a) for a in self.key_args]
        named += [("fact_scope", self.fact_scope)] if self.fact_scope is not None else []
        named += [(f"charges[{d!r}]", b) for d, b in self.charges.items() if isinstance(b, str)]
        for option, arg in named:
            if arg not in known:
                raise JobDefinitionError(
                    f"tool {name!r}: {option} names {arg!r}, which is not one of its arguments "
                    f"({', '.join(known) or 'none'}): name an argument of the tool"
                )

    def charge_bounds(self, args: Mapping[str, Any]) -> dict[str, int]:
        """What a call with these (validated) arguments may charge to each job dimension."""
        out = {}
        for dimension, bound in self.charges.items():
            value = args.get(bound, 0) if isinstance(bound, str) else bound
            out[dimension] = max(0, int(value)) if isinstance(value, int | float) else 0
        return out

    def argument_problems(self, args: Any) -> list[str]:
        """Where the arguments break the tool's schema, one bounded line each (none: valid).
        Valid arguments, the usual case, cost a plain check (a simple schema's) or one pass of
        the validator; only invalid ones are walked for their errors."""
        surely_valid = self._surely_valid
        if surely_valid is not None and surely_valid(args):
            return []
        if self._validator.is_valid(args):
            return []
        problems = []
        for error in sorted(self._validator.iter_errors(args), key=lambda e: list(e.path)):
            where = "/".join(str(p) for p in error.path) or "arguments"
            problems.append(f"{where}: {error.message}"[:200])
        return problems

    def facts_from(self, args: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
        """Allow-listed fields of a successful result, named after the scoping argument."""
        prefix = f"{args.get(self.fact_scope)}." if self.fact_scope else ""
        return {f"{prefix}{k}": result[k] for k in self.facts if k in result}


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Draft202012Validator:
    """Checking a schema against the meta-schema costs milliseconds: do it once per schema."""
    schema = msgspec.json.decode(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


# What `_fast_check` compiles: an object of named, simply typed values. Any other keyword
# (a format, a pattern, a union, nesting) leaves the schema to the validator alone.
_FAST_OBJECT_KEYS = frozenset(
    {"type", "properties", "required", "additionalProperties", "description", "title"}
)
_FAST_VALUE_KEYS = frozenset(
    {"type", "minLength", "maxLength", "minimum", "maximum", "enum", "description", "title",
     "default", "examples"}
)  # fmt: skip
_FAST_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),  # bool is left out by the exact type test; an integral float too
    "number": (int, float),
    "boolean": (bool,),
}


def _number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


def _simple(schema: object) -> tuple[type, ...] | None:
    """The Python types of a simple argument schema whose other keywords suit them, or None."""
    if not isinstance(schema, dict) or not set(schema) <= _FAST_VALUE_KEYS:
        return None
    types = _FAST_TYPES.get(schema.get("type"))  # type: ignore[arg-type]
    lengths = [schema.get("minLength"), schema.get("maxLength")]
    bounds = [schema.get("minimum"), schema.get("maximum")]
    choices = schema.get("enum")
    fits = types is not None and all(b is None or type(b) is int for b in lengths)
    fits = fits and all(b is None or _number(b) for b in bounds)
    if types != (str,):  # lengths and enums only for text, bounds only for numbers
        fits = fits and lengths == [None, None] and choices is None
    else:
        fits = fits and bounds == [None, None]
        fits = fits and (choices is None or (isinstance(choices, list)
                         and all(type(c) is str for c in choices)))  # fmt: skip
    return types if fits else None


def _fast_value(schema: object) -> Callable[[Any], bool] | None:
    """A predicate for one argument's schema, or None when it is not a simple one."""
    types = _simple(schema)
    if types is None:
        return None
    assert isinstance(schema, dict)
    min_len, max_len = schema.get("minLength") or 0, schema.get("maxLength")
    lo, hi = schema.get("minimum"), schema.get("maximum")
    choices = schema.get("enum")
    allowed = frozenset(choices) if choices is not None else None
    if types == (str,):

        def text(value: Any) -> bool:
            if type(value) is not str or len(value) < min_len:
                return False
            if max_len is not None and len(value) > max_len:
                return False
            return allowed is None or value in allowed

        return text

    def number(value: Any) -> bool:
        if type(value) not in types:
            return False
        if type(value) is float and not math.isfinite(value):
            return False
        return (lo is None or value >= lo) and (hi is None or value <= hi)

    return number


def _fast_object(schema: Any) -> tuple[dict[str, Any], tuple[str, ...], bool] | None:
    """(properties, required, closed) of a simple object schema, or None."""
    if not isinstance(schema, dict) or not set(schema) <= _FAST_OBJECT_KEYS:
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    fits = schema.get("type") == "object" and isinstance(properties, dict)
    fits = fits and isinstance(required, list) and all(type(r) is str for r in required)
    fits = fits and (extra is True or extra is False)
    return (properties, tuple(required), extra is False) if fits else None


@functools.lru_cache(maxsize=256)
def _fast_check(schema_json: str) -> Callable[[Any], bool] | None:
    """A plain predicate for a simple schema (an object of named strings, integers, numbers
    and booleans, with lengths, bounds and string enums): True only when the arguments surely
    pass the validator; False says nothing, and the validator is asked. None: not simple."""
    shape = _fast_object(msgspec.json.decode(schema_json))
    if shape is None:
        return None
    properties, must, closed = shape
    checks = {name: _fast_value(sub) for name, sub in properties.items()}
    if any(check is None for check in checks.values()):
        return None

    def surely_valid(args: Any) -> bool:
        if type(args) is not dict:
            return False
        for name in must:
            if name not in args:
                return False
        for name, value in args.items():
            check = checks.get(name)
            if check is None:
                if closed:
                    return False
            elif not check(value):
                return False
        return True

    return surely_valid


def error(code: str, detail: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"status": "error", "code": code}
    if detail is not None:
        out["detail"] = detail
    return out


def json_problem(value: Any, where: str = "result") -> str | None:
    """Why a value is not plain JSON, naming where (`result.when is a datetime`), or None.
    Stricter than the encoder, which would turn a set into a list in no stable order and a
    datetime into text: a tool says what it means, or is told."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, at, depth = stack.pop()
        if depth > MAX_RESULT_DEPTH:
            return f"{at} is nested deeper than {MAX_RESULT_DEPTH}"
        if item is None or isinstance(item, bool | int | str):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return f"{at} is {item}, which JSON cannot carry"
            continue
        if isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    return f"{at} has a key that is not text ({type(key).__name__} {key!r:.40})"
                stack.append((sub, f"{at}.{key:.40}", depth + 1))
            continue
        if isinstance(item, list | tuple):
            stack.extend((sub, f"{at}[{i}]", depth + 1) for i, sub in enumerate(item))
            continue
        return f"{at} is a {type(item).__name__}, not a JSON value"
    return None


def _plain(value: Any) -> tuple[Any, str | None]:
    """The value as decoded JSON (tuples become lists, as after a reload), or why it cannot be."""
    problem = json_problem(value)
    if problem is not None:
        return None, one_line(f"not JSON: {problem}")
    try:
        encoded = msgspec.json.encode(value)
    except (TypeError, ValueError, OverflowError) as exc:
        return None, one_line(f"not JSON: {exc}")
    if len(encoded) > MAX_RESULT_BYTES:
        return None, f"result of {len(encoded)} bytes is over {MAX_RESULT_BYTES}"
    return msgspec.json.decode(encoded), None


def observe_value(raw: Any) -> tuple[dict[str, Any], bool]:
    """A plain value a tool returned, as an observation: `{"status": "ok", "result": value}`,
    or a `bad_result` error naming why it is not one (counted as the dependency failing)."""
    plain, problem = _plain(raw)
    if problem is not None:
        return error("bad_result", problem), True
    return {"status": "ok", "result": plain}, False


def observe_error(exc: ToolError) -> tuple[dict[str, Any], bool]:
    """A ToolError as its error observation; a code that is not a short name is a bad_result."""
    code = exc.code
    if not isinstance(code, str) or not code.strip() or len(code) > MAX_CODE_CHARS:
        why = f"ToolError needs a code of 1-{MAX_CODE_CHARS} characters, got {code!r:.80}"
        return error("bad_result", why), True
    detail, problem = _plain(exc.detail)
    if problem is not None:  # a detail that is not JSON is shown as text
        detail = one_line(exc.detail, 2000)
    return error(one_line(code, MAX_CODE_CHARS), detail), False


def normalize_result(raw: Any) -> tuple[dict[str, Any], bool]:
    """A ToolOutput's result (the status envelope) as an observation, and whether it counts as
    the dependency failing.

    Garbage (not a mapping, no known status, not JSON, too large) becomes an error observation
    that names what was wrong, never an exception.
    """
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) for k in raw):
        return error("bad_result", f"expected an object, got {type(raw).__name__}"), True
    if raw.get("status") not in RESULT_STATUSES:
        return error("bad_result", f"unknown status {str(raw.get('status'))[:40]!r}"), True
    if raw["status"] == "error" and not isinstance(raw.get("code"), str):
        return error("bad_result", "an error result needs a string code"), True
    plain, problem = _plain(dict(raw))
    if problem is not None:
        return error("bad_result", problem), True
    return plain, False
