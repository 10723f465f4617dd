"""The slash commands: one table of names, help texts and handlers with validated arguments.

A handler gets the chat state and the text after the command name. A bad argument raises
CommandError (one line, nothing changed); returning STOP ends the chat.
"""

from __future__ import annotations

import dataclasses
import difflib

from llama_chat.chat.display import stats_line
from llama_chat.engine.cache import KVCache
from llama_chat.engine.sampling import SETTING_HELP, SamplingSettings
from llama_chat.engine.speculation import LOOKUP_AUTO, Speculation, parse_lookup
from llama_chat.errors import LlamaChatError, UsageError
from llama_chat.llama import Llama
from llama_chat.model_info import model_info
from llama_chat.parallel.sharding import RankLost
from llama_chat.process_memory import memory_now_mb
from llama_chat.repl.chat_state import (
    STOP,
    ChatState,
    Command,
    CommandError,
    Handler,
    exchanges,
    parse_number,
    shorten,
)
from llama_chat.repl.render import Renderer
from llama_chat.repl.workbench_commands import (
    describe_format,
    run_branches,
    run_copy,
    run_edit,
    run_format,
    run_read,
)

# Sampling settings, each a command with one number: (field, kind, argument name, help, aliases).
_ALIASES = {"temperature": ("temp",)}
_SETTINGS = [
    (name, type(getattr(SamplingSettings(), name)), argument, about, _ALIASES.get(name, ()))
    for name, (argument, about) in SETTING_HELP.items()
]


def change_setting(state: ChatState, **values: object) -> None:
    """Replace settings; an invalid value leaves the old settings in place."""
    state.session.apply_settings(values, "set in the chat")


def setting_command(field: str, kind: type, argument: str, about: str, aliases: tuple[str, ...]) -> Command:
    def run(state: ChatState, text: str) -> None:
        if text:
            change_setting(state, **{field: parse_number(kind, field, text)})
        state.renderer.line(f"{field} = {getattr(state.session.settings, field)}")

    return Command(field, argument, about, run, aliases)


def run_seed(state: ChatState, text: str) -> None:
    if text:
        seed = None if text == "random" else parse_number(int, "seed", text)
        change_setting(state, seed=seed)
    seed = state.session.settings.seed
    state.renderer.line(f"seed = {'random' if seed is None else seed}")


def run_settings(state: ChatState, text: str) -> None:
    session = state.session
    for field in dataclasses.fields(SamplingSettings):
        source = session.setting_sources.get(field.name)
        where = f" ({source})" if source else ""
        state.renderer.line(f"{field.name} = {getattr(session.settings, field.name)}{where}")
    state.renderer.line(f"system = {session.system!r}")
    state.renderer.line(f"context = {session.capacity} tokens, chat format {session.model.chat_format.name}")
    for name in SWITCHES:
        state.renderer.line(f"{name} = {switch_value(state.renderer, name)}")
    draft = session.speculation.draft
    state.renderer.line(f"draft = {draft.path or draft.model.name}" if draft else "draft = off")
    drafts_instead = " (the draft model drafts instead)" if draft else ""
    state.renderer.line(f"lookup = {describe_lookup(session.speculation)}{drafts_instead}")
    state.renderer.line(f"format = {describe_format(session)}")


def run_system(state: ChatState, text: str) -> None:
    session = state.session
    if not text:
        state.renderer.line(f"system prompt: {session.system}" if session.system else "no system prompt")
        return
    session.set_system(None if text == "clear" else text)
    state.renderer.note("system prompt removed" if text == "clear" else "system prompt set")


def run_clear(state: ChatState, text: str) -> None:
    state.session.clear()
    kept = " (system prompt kept)" if state.session.system else ""
    state.renderer.note(f"conversation cleared{kept}")


def run_retry(state: ChatState, text: str) -> None:
    state.renderer.play(state.session.retry())


def run_undo(state: ChatState, text: str) -> None:
    removed = state.session.undo()
    state.renderer.note(f"removed the last exchange ({shorten(removed.user)})")


def run_load(state: ChatState, text: str) -> None:
    session = state.session
    try:
        model = state.load_model(text)
    except RankLost:
        raise  # the group is broken: the run ends
    except Exception as error:  # a foreign file can fail in many ways; the chat must go on
        reason = str(error) if isinstance(error, LlamaChatError) else f"{type(error).__name__}: {error}"
        raise CommandError(f"could not load {text}: {reason}; still chatting with {session.model.name}") from None
    draft_note = session.set_model(model, text)
    state.renderer.note(
        f"loaded {model.name} on {describe_briefly(model)}, context {session.capacity} tokens; "
        f"the conversation goes on ({exchanges(len(session.exchanges))})"
    )
    if draft_note:
        state.renderer.note(draft_note)


def run_lookup(state: ChatState, text: str) -> None:
    try:
        state.session.set_lookup(parse_lookup(text))
    except UsageError as error:
        raise CommandError(str(error).replace("--lookup", "/lookup")) from None
    state.renderer.note(f"prompt lookup: {describe_lookup(state.session.speculation)}")


def run_draft(state: ChatState, text: str) -> None:
    session = state.session
    if text == "off":
        session.set_draft(None)
        state.renderer.note(f"draft model off; prompt lookup: {describe_lookup(session.speculation)}")
        return
    try:
        draft = state.load_draft(text)
    except RankLost:
        raise
    except Exception as error:  # noqa: BLE001 (as /load: the chat goes on)
        reason = str(error) if isinstance(error, LlamaChatError) else f"{type(error).__name__}: {error}"
        raise CommandError(f"could not load the draft model {text}: {reason}") from None
    try:
        session.set_draft(draft, text)
    except UsageError as error:
        raise CommandError(str(error)) from None
    state.renderer.note(f"drafting with {draft.name} on {describe_briefly(draft)}")


def describe_lookup(speculation: Speculation) -> str:
    if speculation.lookup == 0:
        return "off"
    if speculation.lookup == LOOKUP_AUTO:
        return "auto (drafts where it measures faster)"
    return f"up to {speculation.lookup} tokens"


def run_save(state: ChatState, text: str) -> None:
    path, cached = state.session.save(text)
    with_cache = f" and the cache of {cached} tokens" if cached else ""
    state.renderer.note(f"saved {exchanges(len(state.session.exchanges))}{with_cache} to {path}")


def run_open(state: ChatState, text: str) -> None:
    note = state.session.open(text)
    if note:
        state.renderer.note(note)
    state.renderer.note(f"opened {text}: {exchanges(len(state.session.exchanges))}")


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
    state.renderer.line(
        f"context: {session.context_used()} of {session.capacity} tokens, {exchanges(len(session.exchanges))}"
    )
    state.renderer.line(describe_cache(session.cache))


def describe_cache(cache: KVCache) -> str:
    """The KV cache's memory: the global layers' grows with the conversation, the windowed
    layers' rings do not."""
    text = (f"KV cache ({str(cache.dtype).removeprefix('torch.')}): {len(cache)} positions of "
            f"{layer_count(cache.global_layers, 'global')}, {len(cache) * cache.position_bytes() / 1e6:.1f} MB")
    if cache.windowed_layers:
        text += (f"; {layer_count(cache.windowed_layers, 'windowed')} hold their last {cache.ring} positions "
                 f"(a window of {cache.window}), {cache.ring_bytes() / 1e6:.1f} MB")
    return text


def layer_count(count: int, kind: str) -> str:
    return f"{count} {kind} layer" + ("s" if count != 1 else "")


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


# The renderer's switches: command name, the Renderer attribute, and the words for on and off.
SWITCHES = {"markdown": ("markdown", ("on", "off")), "think": ("show_thinking", ("show", "hide"))}


def switch_value(renderer: Renderer, name: str) -> str:
    attribute, (on, off) = SWITCHES[name]
    return on if getattr(renderer, attribute) else off


def switch_command(name: str, about: str) -> Command:
    """A command that turns one of the renderer's switches on or off, or shows it."""
    attribute, (on, off) = SWITCHES[name]

    def run(state: ChatState, text: str) -> None:
        if text not in ("", on, off):
            raise CommandError(f"/{name} takes {on} or {off}, got {text!r}")
        if text:
            setattr(state.renderer, attribute, text == on)
        state.renderer.line(f"{name} = {switch_value(state.renderer, name)}")

    return Command(name, f"{on}|{off}", about, run, choices=(on, off))


def run_quit(state: ChatState, text: str) -> bool:
    return STOP


def run_help(state: ChatState, text: str) -> None:
    if text:
        command = find(text.removeprefix("/"))
        state.renderer.line(f"{usage(command)}\n    {command.help}")
        return
    for command in COMMANDS:
        state.renderer.line(f"{usage(command):<30} {command.help}")
    state.renderer.line(
        "A setting's command without an argument shows its value. Esc then Enter (or Alt+Enter) starts "
        "a new line; a message starting with // is sent with one /."
    )


def usage(command: Command) -> str:
    names = " ".join("/" + name for name in (command.name, *command.aliases))
    return f"{names} {command.usage}".rstrip()


def describe_device(model: Llama) -> str:
    """Where and how the model runs, with the reasons (for /device)."""
    return f"{model.device} ({model.describe_weights()}; decode step {model.runner.status.describe()})"


def describe_briefly(model: Llama) -> str:
    """Where and how the model runs, in a few words (the reasons are in /device)."""
    weights = str(model.dtype).removeprefix("torch.") if model.quantization == "none" else model.quantization
    return f"{model.device}, {weights} weights, decode step {model.runner.status.mode.value}"


def describe_memory() -> str:
    """What /device adds: memory held now, resident and the process's own."""
    memory = memory_now_mb()
    if memory is None:
        return ""
    return (f"memory: {memory[0]:.0f} MB resident, {memory[1]:.0f} MB of it this process's own (the rest is "
            "mapped files, shared with other processes and reclaimable)")


def needs_argument(run: Handler, what: str) -> Handler:
    def checked(state: ChatState, text: str) -> bool | None:
        if not text:
            raise CommandError(f"this command needs {what}")
        return run(state, text)

    return checked


def takes_no_argument(name: str, run: Handler) -> Handler:
    def checked(state: ChatState, text: str) -> bool | None:
        if text:
            raise CommandError(f"/{name} takes no argument")
        return run(state, text)

    return checked


def _plain(name: str, about: str, run: Handler, aliases: tuple[str, ...] = ()) -> Command:
    return Command(name, "", about, takes_no_argument(name, run), aliases)


COMMANDS: list[Command] = [
    Command("help", "[COMMAND]", "list the commands, or explain one", run_help),
    *(setting_command(*spec) for spec in _SETTINGS),
    Command("seed", "N|random", "seed for reproducible sampling", run_seed,
            choices=("random",)),
    _plain("settings", "show every setting", run_settings),
    Command("system", "[TEXT|clear]", "set the system prompt (no argument: show it; clear: remove it)",
            run_system, choices=("clear",)),
    _plain("clear", "start over (the system prompt stays)", run_clear),
    _plain("retry", "generate the last reply again", run_retry),
    _plain("undo", "remove the last exchange", run_undo),
    Command("edit", "[N]", "put user message N (from 1; default: the last) back in the line to change and "
            "resend; the replies from there on stay another version (Ctrl-C or an empty line: no change)",
            run_edit),
    Command("branches", "[N]", "list the versions where /retry and /edit forked the conversation (* the one "
            "followed), or follow version N", run_branches),
    Command("load", "PATH", "load other weights; the conversation goes on",
            needs_argument(run_load, "a model path"), takes_path=True),
    Command("save", "FILE", "save the conversation, settings and model path as JSON",
            needs_argument(run_save, "a file name"), takes_path=True),
    Command("open", "FILE", "open a conversation saved with /save",
            needs_argument(run_open, "a file name"), takes_path=True),
    Command("lookup", "N|auto", "draft up to N tokens by prompt lookup (0: off; auto: where it measures faster)",
            needs_argument(run_lookup, "a number of tokens or auto"), choices=("auto", "0")),
    Command("draft", "PATH|off", "draft with a smaller model of the same vocabulary (off: prompt lookup again)",
            needs_argument(run_draft, "a model path or off"), takes_path=True),
    Command("read", "PATH...|clear", "put text files (globs too) into the next message, each with its name",
            run_read, choices=("clear",), takes_path=True, several=True),
    Command("copy", "[code]", "put the last reply (code: its last code block) on the clipboard, through the terminal",
            run_copy, choices=("code",)),
    Command("format", "json|schema FILE|regex PATTERN|grammar FILE|off",
            "hold replies to a format: any JSON object, a JSON Schema, a regex or a grammar (no argument: show it)",
            run_format, choices=("json", "schema", "regex", "grammar", "off")),
    _plain("stats", "statistics of the last reply and the context", run_stats),
    _plain("device", "the device and dtype the model runs on", run_device),
    _plain("info", "what the model file holds: shapes, tensor types, license, template, stop tokens", run_info),
    switch_command("markdown", "render finished replies as Markdown"),
    switch_command("think", "a reasoning model's thinking: keep it on screen, or fold it to one line"),
    _plain("quit", "leave (Ctrl-D does too)", run_quit, aliases=("exit", "bye")),
]

_BY_NAME = {name: command for command in COMMANDS for name in (command.name, *command.aliases)}


def names() -> list[str]:
    """Every command name and alias."""
    return list(_BY_NAME)


def find_or_none(name: str) -> Command | None:
    return _BY_NAME.get(name)


def find(name: str) -> Command:
    """The command called name, or a CommandError suggesting the closest one."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    # A command the name begins (/temper: /temperature), else the most similar one.
    close = [candidate for candidate in names() if name and candidate.startswith(name)]
    close = close or difflib.get_close_matches(name, names(), n=1, cutoff=0.5)
    hint = f"did you mean /{close[0]}? " if close else ""
    raise CommandError(f"unknown command /{name}: {hint}(/help lists the commands)")


def dispatch(state: ChatState, line: str) -> bool:
    """Run a "/command argument" line; False when the chat should end."""
    name, argument = (line.strip().removeprefix("/").split(None, 1) + ["", ""])[:2]
    return not find(name.lower()).run(state, argument.strip())
