"""The warehouse's MCP server: stock levels and purchase orders.

    python server.py              # stdio (how the job starts it: by this file's path)
    python server.py --http PORT  # streamable HTTP at /mcp

Orders are kept in the server's memory, one per idempotency key (`_meta`
`turnstile/idempotency-key`): the same key again answers with the order already placed. A
real warehouse keeps them in its database, by the same key.
"""

from __future__ import annotations

import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

KEY = "turnstile/idempotency-key"
STOCK = {"SKU-1": 120, "SKU-7": 3, "SKU-9": 0}

server = MCPServer("warehouse", log_level="WARNING")
orders: dict[str, dict[str, Any]] = {}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def stock_level(sku: str) -> dict[str, Any]:
    """How many of a SKU the warehouse has on hand."""
    return {"sku": sku, "on_hand": STOCK.get(sku, 0)}


@server.tool()
def reorder(sku: str, quantity: int, ctx: Context) -> dict[str, Any]:
    """Place a purchase order with the supplier (it cannot be cancelled)."""
    key = str(dict(ctx.request_context.meta or {}).get(KEY) or f"unkeyed-{len(orders)}")
    placed = orders.setdefault(key, {"order": f"PO-{len(orders) + 1}", "sku": sku,
                                     "quantity": quantity})  # fmt: skip
    return dict(placed)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run()


if __name__ == "__main__":
    main()
