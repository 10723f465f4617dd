"""Slash commands for the conversation and its versions: /system, /clear, /retry, /undo,
/edit, /branches, and /stats (the last reply and what the conversation takes)."""

from __future__ import annotations

from llama_chat.chat.display import stats_line
from llama_chat.engine.cache import KVCache
from llama_chat.repl.chat_state import ChatState, CommandError, exchanges, parse_number, shorten


def run_system(state: ChatState, text: str) -> None:
    session, system = state.session, state.session.conversation.system
    if not text:
        state.renderer.line(f"system prompt: {system}" if system else "no system prompt")
        return
    session.set_system(None if text == "clear" else text)
    state.renderer.note("system prompt removed" if text == "clear" else "system prompt set")


def run_clear(state: ChatState, text: str) -> None:
    state.session.clear()
    if state.history is not None:  # the cleared one stays in the history; a new one begins
        state.history.conversation_id = None
    kept = " (system prompt kept)" if state.session.conversation.system else ""
    state.renderer.note(f"conversation cleared{kept}")


def run_compact(state: ChatState, text: str) -> None:
    state.renderer.note("summarising the older exchanges…")
    count, before, after = state.session.compact()
    state.renderer.note(f"compacted {exchanges(count)} into a summary: the context went from {before} to "
                        f"{after} tokens (the exchanges stay in the history)")


def run_retry(state: ChatState, text: str) -> None:
    tools = state.tool_runner()
    state.renderer.play(state.session.retry(), tools)


def run_undo(state: ChatState, text: str) -> None:
    removed = state.session.undo()
    state.renderer.note(f"removed the last exchange ({shorten(removed.user)})")


def run_edit(state: ChatState, text: str) -> None:
    session = state.session
    number = parse_number(int, "edit", text) if text else len(session.conversation.exchanges)
    if not 1 <= number <= len(session.conversation.exchanges):
        raise CommandError(session.conversation.no_message(number))
    state.editing = number  # the prompt shows it next; sending it makes a new version


def run_branches(state: ChatState, text: str) -> None:
    session = state.session
    if text:
        number = parse_number(int, "branches", text)
        session.switch_version(number)
        last = session.conversation.exchanges[-1]
        state.renderer.note(f"following version {number}: {exchanges(len(session.conversation.exchanges))}, the last "
                            f"{shorten(last.user)} -> {shorten(last.reply)}")
        return
    listed = session.conversation.versions()
    if not listed:
        state.renderer.line("the conversation has one version: /retry and /edit make others")
    fork = None
    for version in listed:
        if version.position != fork:
            fork = version.position
            state.renderer.line(f"at message {fork + 1}:")
        first, more = version.exchanges[0], len(version.exchanges) - 1
        then = f" (then {exchanges(more)})" if more else ""
        mark = "*" if version.current else " "
        state.renderer.line(f"{mark} {version.number:>2}  {shorten(first.user)} -> {shorten(first.reply)}{then}")


def run_stats(state: ChatState, text: str) -> None:
    session = state.session
    stats = session.last_stats
    if stats is None:
        state.renderer.line("no reply yet")
    else:
        state.renderer.line(f"last reply: {stats_line(stats)}")
        state.renderer.line(
            f"prompt {stats.prompt_tokens} tokens: {stats.reused_tokens} reused from the cache, "
            f"{stats.prefilled_tokens} prefilled at {stats.prefill_tokens_per_second:.0f} tok/s; "
            f"ended by {stats.stop_reason}"
        )
    count = len(session.conversation.exchanges)
    state.renderer.line(f"context: {session.context_used()} of {session.capacity} tokens, {exchanges(count)}")
    state.renderer.line(describe_cache(session.cache))


def describe_cache(cache: KVCache) -> str:
    """The KV cache's memory: the global layers' grows with the conversation, the windowed
    layers' rings do not."""
    text = (f"KV cache ({str(cache.dtype).removeprefix('torch.')}): {len(cache)} positions of "
            f"{layers_phrase(cache.global_layers, 'global')}, {len(cache) * cache.position_bytes() / 1e6:.1f} MB")
    if cache.windowed_layers:
        text += (f"; {layers_phrase(cache.windowed_layers, 'windowed')} hold their last {cache.ring} positions "
                 f"(a window of {cache.window}), {cache.ring_bytes() / 1e6:.1f} MB")
    return text


def layers_phrase(count: int, kind: str) -> str:
    return f"{count} {kind} layer" + ("s" if count != 1 else "")
