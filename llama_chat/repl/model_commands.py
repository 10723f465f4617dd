"""Slash commands for the model and where it runs: /load (other weights), /device, /info
(what the model file holds), and the words the chat describes a model with."""

from __future__ import annotations

from llama_chat.engine.runners import ThreadGovernor
from llama_chat.errors import LlamaChatError
from llama_chat.llama import Llama
from llama_chat.model_info import model_info
from llama_chat.parallel.sharding import RankLost
from llama_chat.process_memory import memory_now_mb
from llama_chat.repl.chat_state import ChatState, CommandError, exchanges
from llama_chat.text.tools_format import call_syntax_of


def run_load(state: ChatState, text: str) -> None:
    session = state.session
    try:
        model = state.load_model(text)
    except RankLost:
        raise  # the group is broken: the run ends
    except Exception as error:  # noqa: BLE001 (a foreign file can fail in many ways; the chat must go on)
        reason = str(error) if isinstance(error, LlamaChatError) else f"{type(error).__name__}: {error}"
        raise CommandError(f"could not load {text}: {reason}; still chatting with {session.model.name}") from None
    draft_note = session.set_model(model, text)
    state.renderer.note(
        f"loaded {model.name} on {describe_briefly(model)}, context {session.capacity} tokens; "
        f"the conversation goes on ({exchanges(len(session.exchanges))})"
    )
    if draft_note:
        state.renderer.note(draft_note)


def run_device(state: ChatState, text: str) -> None:
    state.renderer.line(describe_device(state.session.model))
    memory = describe_memory()
    if memory:
        state.renderer.line(memory)


def run_info(state: ChatState, text: str) -> None:
    path = state.session.model_path
    if path is None:
        raise CommandError(f"{state.session.model.name} was not loaded from a file: there is nothing to read")
    for label, value in model_info(path):
        state.renderer.line(f"{label + ':':15}{value}")
    state.renderer.line(f"{'tool calls:':15}{describe_tool_calls(state.session.model)}")


def describe_tool_calls(model: Llama) -> str:
    """The format the model's tool calls are written and read in, and where that comes from."""
    syntax = call_syntax_of(model.chat_format)
    if syntax.native:
        return f"{syntax.name} (its chat template takes tools)"
    return f"{syntax.name}: tools described in the system prompt, calls as <tool_call>{{...}}</tool_call>"


def describe_device(model: Llama) -> str:
    """Where and how the model runs, with the reasons (for /device)."""
    threads = threads_note(model)
    return f"{model.device} ({model.describe_weights()}; decode step {model.runner.status.describe()}{threads})"


def threads_note(model: Llama) -> str:
    """The threads the model's last call ran on, where a governor chooses them."""
    runner = model.runner
    while not isinstance(runner, ThreadGovernor):
        runner = getattr(runner, "inner", None)
        if runner is None:
            return ""
    return f"; {runner.threads} of {runner.most} threads, as measured fastest of late"


def describe_briefly(model: Llama) -> str:
    """Where and how the model runs, in a few words (the reasons are in /device)."""
    return f"{model.device}, {model.weights.brief(model.dtype)} weights, decode step {model.runner.status.mode.value}"


def describe_memory() -> str:
    """What /device adds: memory held now, resident and the process's own."""
    memory = memory_now_mb()
    if memory is None:
        return ""
    return (f"memory: {memory[0]:.0f} MB resident, {memory[1]:.0f} MB of it this process's own (the rest is "
            "mapped files, shared with other processes and reclaimable)")
