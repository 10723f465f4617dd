"""Talking to one MCP server with the SDK: the session (what llama-chat offers a server and
what it reports of it), the listing of its tools, the HTTP connection, and what went wrong
with it in words."""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import mcp_types as types
from mcp import ClientSession
from mcp.client._transport import TransportStreams
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

from llama_chat.errors import first_line
from llama_chat.tools.mcp_config import HttpServerConfig
from llama_chat.tools.mcp_stdio import MAX_MESSAGE_BYTES, StartFailure
from llama_chat.tools.mcp_tools import MAX_TOOLS, printable

MAX_TOOL_PAGES = 16  # of a paginated tools/list, so that a server's listing always ends
# The SDK's own: a server's stream of events may be quiet for minutes (a call's time limit is McpServers').
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)

# The SDK logs what goes wrong with a server; with no handler anywhere, Python would print
# that on the terminal. Here it becomes a notice instead; a program that sets up logging
# still gets the records.
for _logger in ("mcp", "client", "httpx2"):
    logging.getLogger(_logger).addHandler(logging.NullHandler())


class ReportingSession(ClientSession):
    """A client session that reports a server's requests for what llama-chat does not offer
    (sampling, elicitation, roots: the SDK refuses them) and its lines that are not JSON-RPC,
    and reads its tool list one tool at a time. `report(kind, what)` is called on the event loop."""

    def __init__(self, read_stream: Any, write_stream: Any, report: Callable[[str, str], None]) -> None:
        self._wire = JSONRPCDispatcher(read_stream, write_stream)
        super().__init__(dispatcher=self._wire, message_handler=self._on_message, client_info=_CLIENT)
        self._report = report

    async def listed_tools(self) -> list[Any]:
        """The entries of the server's tool list, through its pages, stopping past MAX_TOOLS;
        unchecked (see mcp_tools.checked_tools): the SDK would refuse the whole list for one
        wrong tool in it. [] for a server without tools."""
        capabilities = self.server_capabilities
        if capabilities is None or capabilities.tools is None:
            return []
        options: CallOptions = {"headers": {MCP_PROTOCOL_VERSION_HEADER: self.protocol_version or ""}}
        entries: list[Any] = []
        cursor = None
        for _ in range(MAX_TOOL_PAGES):
            page = await self._wire.send_raw_request("tools/list", None if cursor is None else {"cursor": cursor},
                                                     options)
            tools = page.get("tools")
            if not isinstance(tools, list):
                raise StartFailure("its answer to tools/list has no list of tools")
            entries.extend(tools)
            cursor = page.get("nextCursor")
            if not isinstance(cursor, str) or len(entries) > MAX_TOOLS:
                break
        return entries

    async def dispatch_input_request(self, ctx: ClientRequestContext,
                                     request: types.InputRequest) -> types.InputResponse | types.ErrorData:
        self._report(request.method, f"asked for {request.method}, which llama-chat does not offer; it was refused")
        return await super().dispatch_input_request(ctx, request)

    async def validate_tool_result(self, name: str, result: types.CallToolResult) -> None:
        """Not checked against the tool's output schema: the model gets the result as text
        either way, and a stranger's schema (a pattern) could hold up the loop all servers share."""

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            self._report("not JSON-RPC", "wrote a line that is not JSON-RPC; lines like it are ignored")


class AnswerRefused(httpx2.StreamError):
    """An answer's body past the bound, or one whose size cannot be told as it comes
    (compressed). A StreamError: the SDK ends the request it answers with this message."""


class _BoundedBody(httpx2.AsyncByteStream):
    """A response's body that stops at MAX_MESSAGE_BYTES, or at once where `refusal` says why."""

    def __init__(self, body: httpx2.AsyncByteStream, limit: int | None, refusal: str | None) -> None:
        self.body, self.limit, self.refusal = body, limit, refusal

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.refusal is not None:
            raise AnswerRefused(self.refusal)
        read = 0
        async for chunk in self.body:
            read += len(chunk)
            if self.limit is not None and read > self.limit:
                raise AnswerRefused(f"its answer is larger than {MAX_MESSAGE_BYTES >> 20} MiB, the most llama-chat "
                                     "reads of one answer")
            yield chunk

    async def aclose(self) -> None:
        await self.body.aclose()


class BoundedTransport(httpx2.AsyncHTTPTransport):
    """HTTP whose every answer is read up to MAX_MESSAGE_BYTES, as a stdio server's lines
    are: the SDK reads a JSON answer whole, and a redirect's or an error's body too. An
    event stream may go on for the whole session; the SDK bounds each of its events to
    MAX_MESSAGE_BYTES. Bytes are counted as they come, so an answer must come uncompressed
    (asked for with Accept-Encoding: identity): a few kilobytes of gzip or brotli can
    unpack to gigabytes."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        encoding = response.headers.get("content-encoding", "").strip().lower()
        refusal = None if encoding in ("", "identity") else (
            f"its answer is compressed ({printable(encoding)[:40]}), though llama-chat asks for answers uncompressed")
        events = response.headers.get("content-type", "").partition(";")[0].strip().lower() == "text/event-stream"
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _BoundedBody(response.stream, None if events else MAX_MESSAGE_BYTES, refusal)
        return response


@asynccontextmanager
async def http_streams(config: HttpServerConfig) -> AsyncIterator[TransportStreams]:
    """The streams of a session with a server reached by streamable HTTP."""
    # trust_env=False: a proxy named in the environment is not for a server on this machine.
    headers = httpx2.Headers(dict(config.headers))
    headers["Accept-Encoding"] = "identity"  # see BoundedTransport
    async with httpx2.AsyncClient(headers=headers, timeout=HTTP_TIMEOUT, trust_env=False,
                                  transport=BoundedTransport(trust_env=False)) as client:
        connection = streamable_http_client(config.url, http_client=client, max_sse_event_size=MAX_MESSAGE_BYTES)
        async with connection as streams:
            yield streams


def leaf(error: BaseException | None) -> BaseException | None:
    """What went wrong, out of the exception groups of the task groups around it."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def failure_words(error: BaseException | None) -> str:
    """An exception of a server's connection as words for a notice."""
    error = leaf(error)
    if error is None:
        return "the connection ended"
    if isinstance(error, StartFailure):
        return str(error)
    if isinstance(error, MCPError):
        return f"it answered with an error: {printable(error.error.message)[:300]}"
    return printable(first_line(error))[:300]


def _client_version() -> str:
    try:
        return importlib.metadata.version("llama-chat")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


_CLIENT = types.Implementation(name="llama-chat", version=_client_version())
