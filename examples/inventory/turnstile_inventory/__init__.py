"""A stock-keeping agent whose tools come from an MCP server, written against Turnstile's
public API only.

The job declares the server (`McpServer`); the worker starts it, lists its tools and offers
them to the model: `stock_level` is a read, `reorder` an irreversible write that waits for a
person. The model is scripted (deterministic): read the stock, order when it is below the
run's threshold, answer from the facts the server's structured answers gave.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from turnstile import Budget, Example, Job, McpServer, Scripted

NAME = "inventory"
PARAMS_SCHEMA = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "pattern": "^SKU-[0-9]{1,6}$"},
        "threshold": {"type": "integer", "minimum": 0, "maximum": 1000},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 1000},
    },
    "required": ["sku"],
    "additionalProperties": False,
}
WAREHOUSE = McpServer(
    "warehouse",
    command=sys.executable,  # the worker's own Python, which has the `mcp` package
    args=(str(Path(__file__).with_name("server.py")),),
    facts={"stock_level": ("on_hand",), "reorder": ("order",)},
    timeout_s=30,
)


def _model(params: Mapping[str, Any]) -> Scripted:
    sku = str(params["sku"])
    threshold, quantity = int(params.get("threshold", 10)), int(params.get("quantity", 50))

    def reply(view: Any, step: int) -> dict[str, Any]:
        facts = view["facts"]
        if "on_hand" not in facts:
            return {"type": "tool", "name": "stock_level", "args": {"sku": sku}}
        if facts["on_hand"] < threshold and "order" not in facts:
            return {"type": "tool", "name": "reorder", "args": {"sku": sku, "quantity": quantity}}
        if "order" in facts:
            said = f"Ordered {quantity} of {sku} ({facts['order']}); had {facts['on_hand']}."
        else:
            said = f"{sku} has {facts['on_hand']}: no order needed."
        return {"type": "final", "outcome": "completed", "text": said}

    return Scripted(reply, 0.2)


def inventory() -> Job:
    """The inventory job: its tools are the warehouse server's."""
    return Job(
        name=NAME,
        description="Keep a SKU in stock: read its level, order more when low.",
        tools={},
        mcp=[WAREHOUSE],
        model=_model,
        params_schema=PARAMS_SCHEMA,
        budget=Budget(max_steps=6, max_tool_calls=4, deadline_ms=60_000),
        examples=(
            Example("low stock, ordered", "keep SKU-7 in stock", {"sku": "SKU-7"}),
            Example("enough stock", "keep SKU-1 in stock", {"sku": "SKU-1"}),
        ),
    )
