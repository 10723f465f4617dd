"""A chat that started before llama-chat's kernels were built (a new install, a cleared cache,
a new PyTorch) moves onto them once its background build is done, and a one-shot reply that
started a build sees it through before it exits: nothing of the build outlives the chat. So
too the packed-cache entries a first load of a model file writes behind the chat: a chat
finishes them before it exits."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from llama_chat.kernels import native_build, native_state
from llama_chat.kernels.packed_cache_writer import finish_writes, write_failures

if TYPE_CHECKING:  # the chat's modules load only for a chat, not for a one-shot reply
    from llama_chat.cli.loaders import CompilingLoader
    from llama_chat.repl.chat_state import ChatState


def move_onto_built_kernels(state: ChatState, loader: CompilingLoader) -> None:
    """Once the build is done: load the model again (the same file and options, through
    `loader`, which compiles its step), now on the kernels where they measure faster, and
    go on with the conversation, as /load does. A build that ended without kernels (it
    failed) lets the compiles that waited for it start."""
    if native_build.build_running():
        return
    if not native_state.load_finished_build():
        loader.compile_deferred()
        return
    from llama_chat.repl.model_commands import describe_briefly

    session = state.session
    model = session.model
    if session.model_path is None or not model.weights.packed or model.device.type != "cpu":
        loader.compile_deferred()
        return  # weights our kernels do not run
    moved = loader(session.model_path)
    note = session.set_model(moved, session.model_path)
    state.renderer.note(f"llama-chat's kernels are built: {moved.name} runs on {describe_briefly(moved)} now "
                        "(the conversation goes on)" + (f"; {note}" if note else ""))


def note_packed_cache_failures(state: ChatState) -> None:
    """A packed-cache write behind the chat that failed (a disk that filled, an I/O error):
    one line, before the next input."""
    for failure in write_failures():
        state.renderer.note(failure)


def finish_kernel_build() -> None:
    """After a one-shot reply: the build it started, waited for (once; the next run loads it)."""
    if not native_build.build_running():
        return
    print("llama-chat: finishing the build of llama-chat's kernels, once (Ctrl-C leaves it for the next run)",
          file=sys.stderr)
    try:
        native_build.wait_for_build()
    except KeyboardInterrupt:
        pass


def finish_packed_cache_writes() -> None:
    """After a one-shot reply or at the chat's end: the packed-cache entries a first load is
    writing, finished (a line where that takes a while; Ctrl-C leaves them for the next
    run), a failure in one line."""
    sys.stdout.flush()  # the reply is out before any wait

    def say(line: str) -> None:
        print(f"llama-chat: {line}", file=sys.stderr)

    for failure in finish_writes(say):
        say(failure)
