"""An MCP server started as a process of the chat's, its messages read from its standard
output one line each.

The SDK's own stdio transport does the same with no bound on a line: a server writing
without end would take the chat's memory. Here a line is cut off at MAX_MESSAGE_BYTES and
the server stopped. The server runs under the guard (tools/guard.py), so it ends with the
chat however the chat ends. Its standard error goes to neither the terminal nor a file: its
last lines are kept, to say why a server failed or ended.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

import anyio
import mcp_types as types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage

from llama_chat.environment import tool_environment
from llama_chat.tools.guard import guarded
from llama_chat.tools.mcp_config import StdioServerConfig
from llama_chat.tools.mcp_tools import printable

MAX_MESSAGE_BYTES = 16 << 20  # a tool's answer is cut to far less (McpServers' output cap)
STDERR_LINES = 20
STDERR_LINE_CHARS = 300
STOP_GRACE_SECONDS = 1.0  # after its input closes, a server may finish by itself this long
EXIT_WAIT_SECONDS = 1.0  # for the guard to end once told to, and for the last of the standard error
_EXIT_POLL_SECONDS = 0.01  # Process.wait() also waits for pipes a descendant may hold: the exit is polled


class StartFailure(Exception):
    """Why a server did not become ready, in words for a notice."""


class StdioConnection:
    """One server process: the streams a ClientSession talks over, and how the process ended."""

    def __init__(self, config: StdioServerConfig, on_end: Callable[[], None]) -> None:
        """`on_end` is called (on the event loop) when the server ends the connection by itself:
        its output closed, or it wrote more than MAX_MESSAGE_BYTES without a line break."""
        self.config = config
        self.stderr: deque[str] = deque(maxlen=STDERR_LINES)
        self.flooded = False
        self.closed_by_server = False  # its output ended before it was asked to stop: it exited, or flooded
        self.returncode: int | None = None
        self._stopping = False
        self._on_end = on_end
        self._stderr_done = anyio.Event()

    def ending(self) -> str:
        """How the process ended, for a notice: "exited with status 2: <its last line of stderr>"."""
        if self.flooded:
            return f"wrote a message of more than {MAX_MESSAGE_BYTES >> 20} MiB and was stopped"
        code = self.returncode
        if code is None:
            how = "closed its output"
        elif (killer := _signal_name(code)) is not None:
            how = f"was killed by {killer}"
        else:
            how = f"exited with status {code}"
        return f"{how}: {self.stderr[-1]}" if self.stderr else how

    @asynccontextmanager
    async def streams(self) -> AsyncIterator[TransportStreams]:
        """Start the server; the read and write streams of its messages. Leaving stops it
        (within STOP_GRACE_SECONDS + 2 * EXIT_WAIT_SECONDS), even when cancelled."""
        config = self.config
        try:
            process = await anyio.open_process(
                guarded([config.command, *config.args]),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=config.cwd, env=tool_environment() | dict(config.env), start_new_session=True,
            )
        except OSError as error:  # the guard runs, so this is the folder (or the machine out of processes)
            where = "" if config.cwd is None else f" in {config.cwd}"
            raise StartFailure(f"cannot start it{where} ({error.strerror or error})") from None
        to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)
        async with anyio.create_task_group() as group:
            group.start_soon(self._read_output, process, to_session)
            group.start_soon(self._write_input, process, from_session)
            group.start_soon(self._read_stderr, process)
            try:
                yield read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    await self._stop(process)
                    for stream in (read_stream, write_stream):
                        await stream.aclose()
                group.cancel_scope.cancel()

    async def _read_output(self, process: Process,
                           to_session: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        assert process.stdout is not None
        pieces: list[bytes] = []
        size = 0
        delivering = True  # once the session is gone, the output is read still (and dropped): the server never blocks
        try:
            async for chunk in process.stdout:
                while chunk:
                    end = chunk.find(b"\n")
                    piece = chunk if end < 0 else chunk[:end]
                    chunk = b"" if end < 0 else chunk[end + 1:]
                    size += len(piece)
                    if size > MAX_MESSAGE_BYTES:
                        self.flooded = True
                        with suppress(ProcessLookupError):
                            process.terminate()  # the guard ends the server: it would go on writing
                        return
                    pieces.append(piece)
                    if end < 0:
                        continue
                    line = b"".join(pieces)
                    pieces, size = [], 0
                    if delivering and line.strip():
                        for message in _messages(line):
                            try:
                                await to_session.send(message)
                            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                                delivering = False
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass  # the stream was closed by the stop
        finally:
            to_session.close()
            if not self._stopping:
                self.closed_by_server = True
                self._on_end()

    async def _write_input(self, process: Process, from_session: MemoryObjectReceiveStream[SessionMessage]) -> None:
        assert process.stdin is not None
        with from_session:
            try:
                async for message in from_session:
                    line = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(line.encode())
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass  # the server closed its input: its output ends too, and that is noticed there

    async def _read_stderr(self, process: Process) -> None:
        assert process.stderr is not None
        partial, overlong = b"", False  # the line begun; whether its start was kept already (it was too long)
        try:
            async for chunk in process.stderr:
                *ended, rest = chunk.split(b"\n")
                for piece in ended:
                    if not overlong:
                        self._keep_stderr(partial + piece)
                    partial, overlong = b"", False
                if not overlong:
                    partial += rest
                    if len(partial) > STDERR_LINE_CHARS:
                        self._keep_stderr(partial)
                        partial, overlong = b"", True
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            self._keep_stderr(partial)
            self._stderr_done.set()

    def _keep_stderr(self, line: bytes) -> None:
        text = printable(line.decode(errors="replace"))[:STDERR_LINE_CHARS]
        if text:
            self.stderr.append(text)

    async def _stop(self, process: Process) -> None:
        assert process.stdin is not None
        self._stopping = True
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await process.stdin.aclose()  # the way MCP asks a stdio server to end
        if not await _exited(process, STOP_GRACE_SECONDS):
            with suppress(ProcessLookupError):  # it may end in between
                process.terminate()  # the guard kills the server's process group and ends
            if not await _exited(process, EXIT_WAIT_SECONDS):
                with suppress(ProcessLookupError):
                    process.kill()
                await _exited(process, EXIT_WAIT_SECONDS)
        with anyio.move_on_after(EXIT_WAIT_SECONDS):
            await self._stderr_done.wait()  # its last words, to say why it ended
        self.returncode = process.returncode
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    await stream.aclose()
        # anyio leaves asyncio's subprocess transport open: it would close at garbage
        # collection, after the loop has gone, and print an error on the terminal.
        transport = getattr(getattr(process, "_process", None), "_transport", None)
        if transport is not None:
            transport.close()


def _signal_name(returncode: int) -> str | None:
    """The signal that ended the server: the guard ends with 128 + N when its command was
    killed by signal N, as shells say; the guard's own process, killed, has -N."""
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None
    try:
        return None if number is None else signal.Signals(number).name
    except ValueError:
        return None


async def _exited(process: Process, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        while process.returncode is None:
            await anyio.sleep(_EXIT_POLL_SECONDS)
    return process.returncode is not None


def _messages(line: bytes) -> list[SessionMessage | Exception]:
    """What one line of a server's output tells the session. A line that is not a JSON-RPC
    message is an exception (the session reports it); when it still looks like an answer to
    a request of ours, an error answer is added, so that the request fails now and not at
    its time limit."""
    try:
        return [SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))]
    except ValueError as error:
        found: list[SessionMessage | Exception] = [error]
    try:
        answer = json.loads(line)
    except (ValueError, RecursionError):
        return found
    if isinstance(answer, dict) and ("result" in answer or "error" in answer):
        request = answer.get("id")
        if isinstance(request, int | str) and not isinstance(request, bool):
            error = types.ErrorData(code=types.INTERNAL_ERROR, message="its answer was not a valid JSON-RPC message")
            found.append(SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request, error=error)))
    return found
