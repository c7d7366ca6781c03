"""Every public name of `turnstile` says what it is: each class and function it exports, and
each public method defined on those classes, has a docstring of its own (not the signature a
dataclass writes for itself)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import turnstile


def _undocumented(owner: str, obj: Any) -> list[str]:
    doc = (obj.__doc__ or "").strip()
    if not doc or doc.startswith(f"{getattr(obj, '__name__', '')}("):
        return [owner]
    if not inspect.isclass(obj):
        return []
    fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
    missing = []
    for name, member in vars(obj).items():
        if name.startswith("_") or name in fields:
            continue  # a field's default (a policy function, say) is documented by the field
        func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if inspect.isfunction(func) and not (func.__doc__ or "").strip():
            missing.append(f"{owner}.{name}")
    return missing


def test_every_public_class_function_and_method_has_a_docstring() -> None:
    """Client, Job, Tool, ToolOutput, ToolError, RunState, Settings, ... and their methods."""
    missing = []
    for name in turnstile.__all__:
        obj = getattr(turnstile, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            missing += _undocumented(name, obj)
    assert missing == []
