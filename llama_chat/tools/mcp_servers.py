"""Tools from MCP servers: the servers a config file lists (tools/mcp_config.py), each started
or reached in the background, its tools offered once it is ready.

One thread runs one event loop (anyio) for all the servers, so start() returns at once and
no server holds up the chat. A call blocks its caller until the answer, the time limit or
Ctrl-C. The servers are strangers: whatever one does (fails to start, exits, hangs, floods,
writes what is not JSON-RPC, asks for sampling), the other servers and the chat go on, a
call to it ends in an error result, and the chat learns of it from take_notices(), one line
naming the server each.

A tool is called by its own name unless another source lists that name too (another server,
or the chat's own tools, `reserved_names`), or it is another tool's full name: then it is
called by its full name, SERVER__NAME, and so is the other server's. The names are the same
whatever order the servers became ready in; a tool called by its own name is renamed when a
server that lists the same name becomes ready (a notice says so).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import partial
from typing import Any

import anyio
import httpx2
import mcp_types as types
from anyio.from_thread import BlockingPortal
from mcp import ClientSession
from mcp.client._transport import TransportStreams
from mcp.shared.exceptions import MCPError

from llama_chat.tools.mcp_config import HttpServerConfig, ServerConfig, StdioServerConfig
from llama_chat.tools.mcp_session import ReportingSession, failure_words, http_streams, leaf
from llama_chat.tools.mcp_stdio import StartFailure, StdioConnection
from llama_chat.tools.mcp_tools import McpTool, checked_tools, cut, printable, result_text
from llama_chat.tools.tool import Tool, ToolResult, ToolSpec

MAX_NOTICES = 20  # about one server; a server that misbehaves on every call says so once
CLOSE_SECONDS = 3.0  # for the servers to stop before what is left on the loop is cancelled
CANCEL_SECONDS = 2.0  # for a cancelled call's cancellation to go out before Ctrl-C goes on
ENDING_SECONDS = 5.0  # for a server that dropped a call to say how it ended (it is being stopped)
OWN_TOOLS = "llama-chat"  # the owner of `reserved_names`, in notices


class ServerState(StrEnum):
    """Where a server is in its life."""

    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"  # never became ready
    EXITED = "exited"  # was ready, and ended by itself or lost its connection
    STOPPED = "stopped"  # by close()


@dataclass(frozen=True)
class ServerStatus:
    """Where one server stands, for a status line: `detail` is one line ("3 tools", or why it
    failed or ended); `stderr`, a stdio server's last lines of standard error."""

    name: str
    state: ServerState
    detail: str
    tools: tuple[Tool, ...] = ()
    stderr: tuple[str, ...] = ()


@dataclass(eq=False)
class _Server:
    config: ServerConfig
    state: ServerState = ServerState.STARTING
    detail: str = "starting"
    tools: tuple[McpTool, ...] = ()
    session: ClientSession | None = None
    connection: StdioConnection | None = None
    scope: anyio.CancelScope | None = None
    finished: anyio.Event | None = None
    stopping: bool = False
    noticed: set[str] = field(default_factory=set)  # the kinds of notice given once
    notices: int = 0

    @property
    def label(self) -> str:
        return f'MCP server "{self.config.name}"'


class McpServers:
    """The servers of a config, run in the background; their ready servers' tools."""

    def __init__(self, configs: Iterable[ServerConfig], timeout_seconds: float = 30.0, output_cap: int = 1 << 20,
                 start_timeout_seconds: float = 60.0, reserved_names: Iterable[str] = ()) -> None:
        """`timeout_seconds` bounds each call, `start_timeout_seconds` a server's start (up
        to its tool list); `output_cap` is the characters of a result kept; `reserved_names`
        are the chat's own tools' names, which no MCP tool takes."""
        self.timeout_seconds = timeout_seconds
        self.start_timeout_seconds = start_timeout_seconds
        self.output_cap = output_cap
        self._servers = [_Server(config) for config in configs]
        if len({server.config.name for server in self._servers}) < len(self._servers):
            raise ValueError("two servers of one name")
        self._reserved = frozenset(reserved_names)
        self._changed = threading.Condition()  # held to read or change the servers and notices
        self._notices: list[str] = []
        self._portal: BlockingPortal | None = None
        self._thread: threading.Thread | None = None
        self._serving: list[concurrent.futures.Future[None]] = []

    def start(self) -> None:
        """Start every server in the background; returns at once."""
        if self._thread is not None:
            return
        portal_ready: concurrent.futures.Future[BlockingPortal] = concurrent.futures.Future()
        self._thread = threading.Thread(target=_run_loop, args=(portal_ready,), name="mcp-servers", daemon=True)
        self._thread.start()
        self._portal = portal_ready.result()
        self._serving = [self._portal.start_task_soon(self._serve, server) for server in self._servers]

    def status(self) -> list[ServerStatus]:
        """Each server's state, in the config's order."""
        with self._changed:
            return [ServerStatus(server.config.name, server.state, server.detail, server.tools,
                                 tuple(server.connection.stderr.copy()) if server.connection else ())
                    for server in self._servers]

    def tools(self) -> list[Tool]:
        """The tools of the servers ready now."""
        with self._changed:
            return [tool for server in self._servers if server.state is ServerState.READY for tool in server.tools]

    def wait_ready(self, seconds: float) -> bool:
        """Wait until no server is starting (each ready, failed...); False when `seconds` ran out first."""
        with self._changed:
            return self._changed.wait_for(
                lambda: all(server.state is not ServerState.STARTING for server in self._servers), timeout=seconds)

    def take_notices(self) -> list[str]:
        """The events worth a line to the user since the last call, each naming its server."""
        with self._changed:
            notices, self._notices = self._notices, []
            return notices

    def close(self) -> None:
        """Stop every server (within about two seconds: no process of theirs is left) and the loop."""
        with self._changed:
            portal, self._portal = self._portal, None
            for server in self._servers:
                server.stopping = True
        if portal is None:
            return
        with suppress(RuntimeError):  # the loop has ended already
            portal.call(self._cancel_servers)
        concurrent.futures.wait(self._serving, timeout=CLOSE_SECONDS)
        with suppress(RuntimeError):
            portal.call(portal.stop, True)
        assert self._thread is not None
        self._thread.join(CLOSE_SECONDS)

    def __enter__(self) -> McpServers:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _cancel_servers(self) -> None:
        for server in self._servers:
            if server.scope is not None:
                server.scope.cancel()

    async def _serve(self, server: _Server) -> None:
        """Run one server from its start to its end, whatever the end."""
        server.finished = anyio.Event()
        ended = anyio.Event()
        failure: Exception | None = None
        try:
            with anyio.CancelScope() as server.scope:
                if server.stopping:
                    return
                async with self._connect(server, ended.set) as (read_stream, write_stream):
                    report = partial(self._notice_once, server)
                    async with ReportingSession(read_stream, write_stream, report) as session:
                        with anyio.move_on_after(self.start_timeout_seconds) as limit:
                            await session.initialize()
                            listed = await session.listed_tools()
                        if limit.cancelled_caught:
                            raise StartFailure(f"it did not answer within {self.start_timeout_seconds:g} s")
                        self._ready(server, session, listed)
                        await ended.wait()
        except Exception as error:
            failure = error
        finally:
            self._finish(server, failure)

    def _connect(self, server: _Server, on_end: Callable[[], None]) -> AbstractAsyncContextManager[TransportStreams]:
        config = server.config
        if isinstance(config, StdioServerConfig):
            server.connection = StdioConnection(config, on_end)
            return server.connection.streams()
        return http_streams(config)

    def _ready(self, server: _Server, session: ClientSession, listed: list[Any]) -> None:
        kept, problems = checked_tools(listed)
        name = server.config.name
        tools = tuple(McpTool(ToolSpec(offered.name, offered.description, offered.parameters, name, offered.name),
                              partial(self._call, server)) for offered in kept)
        with self._changed:
            server.session, server.tools, server.state = session, tools, ServerState.READY
            server.detail = f"{len(tools)} tool{'' if len(tools) == 1 else 's'}"
            for problem in problems:
                self._notice(server, f"{server.label}: {problem}")
            self._name_tools()
            self._changed.notify_all()

    def _name_tools(self) -> None:
        """Give each tool listed so far its name (see the module's docstring), with a notice
        for each tool whose name changes. Called with self._changed held."""
        listed = [tool for server in self._servers for tool in server.tools]  # an ended server's too
        sources: dict[str, list[str | None]] = {name: [None] for name in self._reserved}  # None: the chat's own
        for tool in listed:
            sources.setdefault(tool.spec.listed_name, []).append(tool.spec.source)
        full_names = {tool.spec.qualified_name: tool.spec.source for tool in listed}
        for server in self._servers:
            for tool in server.tools:
                own, full = tool.spec.listed_name, tool.spec.qualified_name
                others = [source for source in sources[own] if source != server.config.name]
                others += [full_names[own]] if own in full_names else []
                name = full if others else own
                if name != tool.spec.name:
                    tool.spec = replace(tool.spec, name=name)
                    owner = OWN_TOOLS if others[0] is None else f'server "{others[0]}"'
                    self._notice(server, f'{server.label}: tool "{own}" is called "{name}" here: '
                                         f"{owner} has a tool of that name")

    def _finish(self, server: _Server, failure: Exception | None) -> None:
        connection = server.connection
        with self._changed:
            was_ready = server.state is ServerState.READY
            server.session = None
            if server.stopping:
                server.state, server.detail = ServerState.STOPPED, "stopped"
            elif was_ready:
                server.state = ServerState.EXITED
                server.detail = connection.ending() if connection else f"lost its connection ({failure_words(failure)})"
                self._notice(server, f"{server.label} {server.detail}")
            else:
                if connection is not None and connection.closed_by_server:
                    reason = f"it {connection.ending()}"
                elif isinstance(config := server.config, HttpServerConfig) and isinstance(
                        leaf(failure), httpx2.TransportError):
                    reason = f"cannot reach {config.url} ({failure_words(failure)})"
                else:
                    reason = failure_words(failure)
                server.state, server.detail = ServerState.FAILED, f"could not start: {reason}"
                self._notice(server, f"{server.label} {server.detail}")
            self._changed.notify_all()
        if server.finished is not None:
            server.finished.set()

    def _notice(self, server: _Server, line: str) -> None:
        """Called with self._changed held."""
        server.notices += 1
        if server.notices <= MAX_NOTICES:
            self._notices.append(line)
        elif server.notices == MAX_NOTICES + 1:
            self._notices.append(f"{server.label}: more notices about it are left out")

    def _notice_once(self, server: _Server, kind: str, what: str) -> None:
        with self._changed:
            if kind not in server.noticed:
                server.noticed.add(kind)
                self._notice(server, f"{server.label} {what}")

    def _call(self, server: _Server, tool_name: str, arguments: dict[str, Any]) -> ToolResult:
        """A tools/call from the calling thread, run on the loop (see McpTool.run)."""
        portal, done = self._portal, threading.Event()
        try:
            if portal is None:
                raise RuntimeError("closed")
            future = portal.start_task_soon(self._send_call, server, tool_name, arguments, done)
        except RuntimeError:
            return ToolResult(f"{server.label} is not running ({server.detail})", is_error=True)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            done.wait(CANCEL_SECONDS)
            raise
        except concurrent.futures.CancelledError:  # the loop was stopped by close()
            return ToolResult(f"{server.label} was stopped before it answered", is_error=True)

    async def _send_call(self, server: _Server, tool_name: str, arguments: dict[str, Any],
                         done: threading.Event) -> ToolResult:
        try:
            session = server.session
            if session is None or server.state is not ServerState.READY:
                return ToolResult(f"{server.label} is not running ({server.detail})", is_error=True)
            dropped = False
            with anyio.move_on_after(self.timeout_seconds):
                try:
                    result = result_text(await session.call_tool(tool_name, arguments))
                    if len(result.text) <= self.output_cap:
                        return result
                    with self._changed:
                        self._notice(server, f'{server.label}: the output of "{tool_name}" ({len(result.text):,} '
                                             f"characters) was cut to {self.output_cap:,}")
                    return cut(result, self.output_cap)
                except MCPError as error:
                    if error.code != types.CONNECTION_CLOSED:
                        message = printable(error.error.message)[:500]
                        return ToolResult(f"{server.label} answered with an error: {message}", is_error=True)
                    dropped = True
                except Exception as error:
                    return ToolResult(f"{server.label}: the call failed ({failure_words(error)})", is_error=True)
            if not dropped:
                seconds = f"{self.timeout_seconds:g} s"
                with self._changed:
                    self._notice(server, f'{server.label} did not answer a call to "{tool_name}" within {seconds}; '
                                         "the request was cancelled")
                return ToolResult(f"{server.label} did not answer within {seconds}; the request was cancelled",
                                  is_error=True)
            assert server.finished is not None
            with anyio.move_on_after(ENDING_SECONDS):
                await server.finished.wait()  # to say how it ended
            ending = server.detail if server.finished.is_set() else "closed the connection"
            return ToolResult(f"{server.label} {ending}, before it answered", is_error=True)
        finally:
            done.set()


def _run_loop(portal_ready: concurrent.futures.Future[BlockingPortal]) -> None:
    """The servers' thread: one event loop, until close() stops its portal."""

    async def serve_portal() -> None:
        async with BlockingPortal() as portal:
            portal_ready.set_result(portal)
            await portal.sleep_until_stopped()

    try:
        anyio.run(serve_portal)
    except BaseException as error:
        # Before the portal is up, start() raises it; after, the servers' states tell what
        # ended, and a traceback from this thread would only reach the terminal.
        if not portal_ready.done():
            portal_ready.set_exception(error)


