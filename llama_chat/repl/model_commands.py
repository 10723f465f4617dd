"""Slash commands for the model and where it runs: /load (other weights), /device, /info
(what the model file holds), and the words the chat describes a model with."""

from __future__ import annotations

from llama_chat.chat.display import literal
from llama_chat.errors import LlamaChatError
from llama_chat.llama import Llama
from llama_chat.model_info import model_info
from llama_chat.models.catalog import Catalog, catalog
from llama_chat.models.sizes import human_parameters, human_size
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
    model.set_prompt_math(session.model.prompt_math)  # the chat's choice holds for the next model too
    earlier_system = session.model.default_system
    draft_note = session.set_model(model, text)
    session.take_recommended_settings()
    if session.conversation.system == earlier_system and model.default_system != earlier_system:
        session.set_system(model.default_system)  # the store's default system prompt, unless the user set one
    state.renderer.note(
        f"loaded {model.name} on {describe_briefly(model)}, context {session.capacity} tokens; "
        f"the conversation goes on ({exchanges(len(session.conversation.exchanges))})"
    )
    if draft_note:
        state.renderer.note(draft_note)


def run_models(state: ChatState, text: str) -> None:
    found = catalog()
    for line in table_lines(found):
        state.renderer.line(line)
    for problem in found.left_out:
        state.renderer.note(f"left out {literal(problem)}")


COLUMNS = ("name", "architecture", "parameters", "quantisation", "size", "chat template", "where")


def table_lines(found: Catalog) -> list[str]:
    """The catalog as aligned columns, names and paths printed literally (they come from strangers)."""
    if not found.rows:
        return ["no models found: the Hugging Face cache, ollama's store, LM Studio's folders and llama-chat's "
                "weights folder hold none llama-chat can run (`llama-chat pull OWNER/REPO` fetches one)"]
    cells = [COLUMNS] + [
        (row.name, row.architecture, human_parameters(row.parameters), row.quantisation, human_size(row.size),
         row.template, row.path)
        for row in found.rows
    ]
    cells = [tuple(literal(cell) for cell in line) for line in cells]
    widths = [max(len(line[column]) for line in cells) for column in range(len(COLUMNS) - 1)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1] for line in cells]


def run_prompt_math(state: ChatState, text: str) -> None:
    model = state.session.model
    if not text:
        state.renderer.line(f"prompt math = {model.prompt_math}")
        return
    try:
        note = model.set_prompt_math(text.lower())
    except LlamaChatError as error:
        raise CommandError(str(error)) from None
    state.renderer.note(note or f"prompt math = {model.prompt_math}: prompt chunks "
                        + ("with 8-bit activation blocks; replies stay exact" if model.prompt_math == "fast"
                           else "at float32-grade fidelity"))


def run_device(state: ChatState, text: str) -> None:
    state.renderer.line(describe_device(state.session.model))
    memory = describe_memory()
    if memory:
        state.renderer.line(memory)


def run_info(state: ChatState, text: str) -> None:
    path = state.session.model_path
    if path is None:
        raise CommandError(f"{state.session.model.name} was not loaded from a file: there is nothing to read")
    source = state.session.model.source
    for label, value in model_info(path):
        if label == "chat template" and source is not None and source.template_note:
            value = source.template_note
        state.renderer.line(f"{label + ':':15}{value}")
    if source is not None and source.origin != "path":
        state.renderer.line(f"{'found as:':15}{source.name} ({source.origin})")
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
    governor = model.runner.governor
    if governor is None:
        return ""
    return f"; {governor.threads} of {governor.most} threads, as measured fastest of late"


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
