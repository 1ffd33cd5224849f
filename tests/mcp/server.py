"""A real MCP server, on the official Python SDK (MCPServer, formerly FastMCP), for the tests
of the turnstone-mcp crate (shared/mcp/tests).

    python server.py --stdio
    python server.py --http PORT [--token TOKEN]   # Streamable HTTP at http://127.0.0.1:PORT/mcp

With --token, a request without `Authorization: Bearer TOKEN` gets 401 before the MCP app sees it.
`slow` appends a line to the file named by MCP_TEST_LOG on each call, so a test can count runs,
and another when notifications/cancelled cancels it.
"""

import argparse
import asyncio
import os
import struct
import sys
import zlib
from typing import Any, TypedDict

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ListToolsResult, TextContent, ToolAnnotations

INVALID_PARAMS = -32602
PAGE_SIZE = 3  # tools/list pages, so that clients must follow nextCursor


class Server(MCPServer):
    async def _handle_list_tools(self, ctx, params) -> ListToolsResult:
        tools = await self.list_tools()
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + PAGE_SIZE
        return ListToolsResult(tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None)

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None):
        # The SDK answers an unknown tool with an isError result; the spec's Tools section
        # ("Error Handling") makes it a protocol error, which the client's tests need to see.
        if self._tool_manager.get_tool(name) is None:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}")
        return await super().call_tool(name, arguments, context)


mcp = Server("turnstone-test")


@mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo(text: str) -> str:
    """Returns its text."""
    return text


class Sum(TypedDict):
    sum: float


@mcp.tool()
def add(a: float, b: float) -> Sum:
    """Adds two numbers (structured content, with an output schema)."""
    return {"sum": a + b}


@mcp.tool()
def tally(a: float, b: float) -> CallToolResult:
    """Adds two numbers, saying so in a sentence, with the figures as structured content only
    (servers SHOULD also send the JSON as text; many send a sentence instead)."""
    total = a + b
    return CallToolResult(
        content=[TextContent(type="text", text=f"The total of the two is {total:g}.")],
        structuredContent={"total": total, "terms": [a, b]},
    )


@mcp.tool()
def fail(message: str) -> str:
    """Fails with the message (a tool execution error: isError true)."""
    raise ToolError(message)


@mcp.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True, open_world_hint=False))
def delete_note(id: str) -> str:
    """Deletes a note (pretends to)."""
    return f"deleted {id}"


def log(line: str) -> None:
    path = os.environ.get("MCP_TEST_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


@mcp.tool()
async def slow(seconds: float, marker: str) -> str:
    """Logs the call to $MCP_TEST_LOG (the marker), then sleeps; a cancelled sleep (after
    notifications/cancelled) logs "cancelled MARKER"."""
    log(marker)
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        log(f"cancelled {marker}")
        raise
    return f"slept {seconds} s ({marker})"


def extra() -> str:
    """Registered by enable_extra."""
    return "extra"


@mcp.tool()
async def enable_extra(ctx: Context) -> str:
    """Registers the tool `extra` and sends notifications/tools/list_changed."""
    if mcp._tool_manager.get_tool("extra") is None:
        mcp.add_tool(extra)
    await ctx.request_context.session.send_tool_list_changed()
    return "extra enabled"


def tiny_png() -> bytes:
    """A 1x1 red PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


@mcp.tool()
def image() -> Image:
    """Returns an image content block."""
    return Image(data=tiny_png(), format="png")


def serve_http(port: int, token: str | None) -> None:
    import uvicorn

    app = mcp.streamable_http_app()
    if token is not None:
        inner = app

        async def app(scope, receive, send):  # noqa: F811 (the guarded app replaces the open one)
            if scope["type"] == "http":
                headers = dict(scope["headers"])
                if headers.get(b"authorization") != f"Bearer {token}".encode():
                    await send({"type": "http.response.start", "status": 401,
                                "headers": [(b"content-type", b"text/plain")]})
                    await send({"type": "http.response.body", "body": b"missing or wrong bearer token"})
                    return
            await inner(scope, receive, send)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def main() -> None:
    parser = argparse.ArgumentParser()
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--stdio", action="store_true")
    mode.add_argument("--http", type=int, metavar="PORT")
    parser.add_argument("--token")
    args = parser.parse_args()
    if args.stdio:
        mcp.run("stdio")
    else:
        serve_http(args.http, args.token)


if __name__ == "__main__":
    sys.exit(main())
