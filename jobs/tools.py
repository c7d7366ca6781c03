"""Tools as the kernel sees them: declared contracts, validated arguments, bounded calls.

A tool declares its argument schema, whether it mutates, whether that can be undone, a cost
bound, a timeout, and which result fields may become facts. None of this is inferred from the
tool's name, and the model cannot change any of it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from turnstile.jobs.errors import JobDefinitionError

MAX_RESULT_BYTES = 256 * 1024  # a result bigger than this is refused rather than carried in state
RESULT_STATUSES = frozenset({"ok", "error", "needs_approval", "unknown"})
PERMANENT_CODES = frozenset({"not_found", "invalid_state", "forbidden"})  # retrying cannot help


@dataclass(frozen=True)
class ToolContext:
    """What a tool call is given. The identity comes from the run, never from the model."""

    run_id: str
    tenant: str
    user_id: str
    params: Mapping[str, Any]
    args: Mapping[str, Any]
    key: str  # idempotency key: the same logical call always carries the same key
    timeout_s: float
    approved: bool = False  # a person approved exactly this call (name and arguments)


@dataclass(frozen=True)
class ToolOutput:
    result: Any
    latency_s: float | None = None  # reported (simulated) latency; measured when None
    cost_microusd: int | None = None  # actual cost; the declared bound when None
    charges: Mapping[str, int] | None = None  # actual job-dimension charges; the bounds when None


ToolFn = Callable[[ToolContext], ToolOutput]
# For a write: did it take effect under this idempotency key? (run id, run params, key).
# Read-only; it lets a closing message say what the world recorded.
RecordedFn = Callable[[str, Mapping[str, Any], str], bool]


@dataclass(frozen=True, eq=False)
class Tool:
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
        for dimension, bound in self.charges.items():
            if not isinstance(bound, int | str) or isinstance(bound, bool):
                raise JobDefinitionError(
                    f"tool {self.name!r}: the bound of {dimension!r} must be an integer or "
                    "the name of an integer argument"
                )

    def charge_bounds(self, args: Mapping[str, Any]) -> dict[str, int]:
        """What a call with these (validated) arguments may charge to each job dimension."""
        out = {}
        for dimension, bound in self.charges.items():
            value = args.get(bound, 0) if isinstance(bound, str) else bound
            out[dimension] = max(0, int(value)) if isinstance(value, int | float) else 0
        return out

    def argument_problems(self, args: Any) -> list[str]:
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


def error(code: str, detail: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"status": "error", "code": code}
    if detail is not None:
        out["detail"] = detail
    return out


def normalize_result(raw: Any) -> tuple[dict[str, Any], bool]:
    """A tool's result as an observation, and whether it counts as the dependency failing.

    Garbage (not a mapping, no known status, not JSON, too large) becomes an error observation
    that names what was wrong, never an exception.
    """
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) for k in raw):
        return error("bad_result", f"expected an object, got {type(raw).__name__}"), True
    if raw.get("status") not in RESULT_STATUSES:
        return error("bad_result", f"unknown status {str(raw.get('status'))[:40]!r}"), True
    if raw["status"] == "error" and not isinstance(raw.get("code"), str):
        return error("bad_result", "an error result needs a string code"), True
    try:
        encoded = msgspec.json.encode(raw)
    except (TypeError, ValueError, OverflowError) as exc:
        return error("bad_result", f"not JSON: {exc}"[:200]), True
    if len(encoded) > MAX_RESULT_BYTES:
        return error(
            "bad_result", f"result of {len(encoded)} bytes is over {MAX_RESULT_BYTES}"
        ), True
    plain: dict[str, Any] = msgspec.json.decode(encoded)  # tuples become lists, as after a reload
    return plain, False
