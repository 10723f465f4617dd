"""Running a chat from the command line: one reply (-p, piped stdin, --raw) or the REPL."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from llama_chat.chat.attachments import PendingFiles, read_into
from llama_chat.repl.call_line import call_line
from llama_chat.chat.display import stats_line, visible
from llama_chat.chat.events import Done, Text, ThoughtDone
from llama_chat.chat.exchange import CallResult, Outcome
from llama_chat.chat.history_keeper import HistoryKeeper
from llama_chat.chat.session import Session
from llama_chat.chat.tool_runner import Answer
from llama_chat.chat.tool_use import ToolUse
from llama_chat.cli.arguments import add_model_arguments, finite_float
from llama_chat.cli.kept_history import add_conversation_arguments, keep_reply, opened_history, resume
from llama_chat.cli.kernel_switch import (
    finish_kernel_build,
    finish_packed_cache_writes,
    move_onto_built_kernels,
    note_packed_cache_failures,
)
from llama_chat.cli.loaders import CompilingLoader, OptionsLoader
from llama_chat.cli.options import draft_options, load_options
from llama_chat.cli.subcommands import SUBCOMMANDS
from llama_chat.cli.tool_options import add_tool_arguments, tool_use_from
from llama_chat.default_model import require_default_model
from llama_chat.engine.sampling import SETTING_HELP, SamplingSettings
from llama_chat.environment import group_timeout
from llama_chat.errors import SettingError, UsageError
from llama_chat.kernels import native_state
from llama_chat.llama import Llama
from llama_chat.options import DraftLength, KernelOptions, LoadOptions
from llama_chat.parallel.group_runner import run_in_group
from llama_chat.parallel.ranks import shard_from_environment
from llama_chat.text.tool_calls import ToolCall
from llama_chat.text.undecodable import replace_undecodable, undecodable_note
from llama_chat.tools.tool import Tool

if TYPE_CHECKING:
    from llama_chat.engine.constraint import AnswerFormat
    from llama_chat.repl.chat_state import ChatState

COMPILE_CHOICES = ("auto", "wait", "off")


def chat_parser() -> argparse.ArgumentParser:
    defaults = SamplingSettings()
    parser = argparse.ArgumentParser(
        prog="llama-chat",
        description="Chat with a local Llama-family model in the terminal.",
        epilog="sub-commands: " + "; ".join(f"{name}: {about}" for name, (_, about) in SUBCOMMANDS.items()),
    )
    add_model_arguments(parser)
    parser.add_argument("--prompt", "-p", help="answer this one message, print the reply and exit")
    parser.add_argument("--raw", action="store_true", help="plain completion of the prompt, no chat template")
    parser.add_argument("--file", "-f", action="append", metavar="PATH",
                        help="put a text file (or a glob's files) into the first message, with its name; repeatable")
    parser.add_argument("--system", help="system prompt")
    parser.add_argument("--ctx-size", type=int, help="context length in tokens (default: the model's, at most 4096)")
    parser.add_argument("--compile", default="auto", choices=COMPILE_CHOICES,
                        help="the compiled decode step on the cpu: auto (built in the background the first time, "
                        "eager meanwhile; a one-shot reply only uses one already built), wait (build it first), "
                        "off (eager)")
    add_conversation_arguments(parser)
    parser.add_argument("--lookup", default="auto", metavar="N|auto",
                        help="speculative decoding by prompt lookup: draft up to N tokens from the conversation "
                        "(0: off; default auto: where it measures faster)")
    parser.add_argument("--draft", metavar="MODEL",
                        help="speculative decoding with a smaller model of the same vocabulary, loaded with the "
                        "default weights mode (for example the same file drafting for --quantize none)")
    parser.add_argument("--think", default="hide", choices=("show", "hide"),
                        help="a reasoning model's <think> part: show it, or hide it (folded to one line in the chat; "
                        "left out of -p's output) (default: hide)")
    answers = parser.add_argument_group("structured answers (at most one; /format in the chat)")
    answers.add_argument("--json-schema", metavar="FILE|JSON", help="every reply is JSON valid for this JSON Schema")
    answers.add_argument("--regex", metavar="PATTERN", help="every reply matches this regular expression, whole")
    answers.add_argument("--grammar", metavar="FILE",
                         help="every reply follows this grammar (llguidance's Lark syntax)")
    add_tool_arguments(parser)
    sampling = parser.add_argument_group("sampling (each also a slash command in the chat)")
    for name, (argument, about) in SETTING_HELP.items():
        default = getattr(defaults, name)
        sampling.add_argument("--" + name.replace("_", "-"), metavar=argument, default=default,
                              type=finite_float if isinstance(default, float) else int,
                              help=f"{about} (default: {default})")
    sampling.add_argument("--seed", type=int, help="seed for reproducible sampling (default: random)")
    parser.add_argument("--stats", action="store_true", help="with -p or piped input: the statistics line on stderr")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def settings_from(options: argparse.Namespace) -> SamplingSettings:
    try:
        # The flags are named after the settings (see chat_parser).
        return SamplingSettings(seed=options.seed, **{name: getattr(options, name) for name in SETTING_HELP})
    except SettingError as error:
        raise UsageError(str(error)) from None


def format_from(options: argparse.Namespace):
    """The answer format the flags ask for (an AnswerFormat, see engine/constraint), or None."""
    given = [(kind, value) for kind, value in (("schema", options.json_schema), ("regex", options.regex),
                                               ("grammar", options.grammar)) if value is not None]
    if len(given) > 1:
        raise UsageError("--json-schema, --regex and --grammar each set the replies' format: give one")
    if not given:
        return None
    from llama_chat.engine.constraint import read_format  # the grammar engine loads only when asked for

    return read_format(*given[0])


def read_prompt(options: argparse.Namespace) -> str | None:
    """The one message to answer: -p, else stdin when it is not a terminal; None for a chat."""
    if options.prompt is not None:
        if not options.prompt.strip():
            raise UsageError("-p is empty: there is nothing to answer; give -p TEXT")
        return checked_text(options.prompt, "-p")
    if sys.stdin is not None and not sys.stdin.isatty():
        # As bytes: a strict locale's text layer would raise on the first byte that is not
        # UTF-8; checked_text replaces each such byte and says so.
        stream = getattr(sys.stdin, "buffer", None)
        prompt = stream.read().decode("utf-8", "surrogateescape") if stream is not None else sys.stdin.read()
        if not prompt.strip():
            raise UsageError("stdin is empty: pipe in a prompt, or give -p TEXT")
        return checked_text(prompt, "stdin")
    if options.raw:
        raise UsageError("--raw needs a prompt: give -p TEXT or pipe text on stdin")
    return None


def checked_text(text: str, where: str) -> str:
    """Text from the command line or stdin, undecodable bytes replaced, with a warning."""
    cleaned, count = replace_undecodable(text)
    if count:
        print(f"llama-chat: {undecodable_note(where, count)}", file=sys.stderr)
    return cleaned


def given_settings(argv: Sequence[str]) -> dict:
    """The sampling settings named on the command line itself (not left at their defaults)."""
    parser = chat_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    given = vars(parser.parse_known_args(list(argv))[0])
    return {name: given[name] for name in (*SETTING_HELP, "seed") if name in given}


def open_conversation(session: Session, options: argparse.Namespace, argv: Sequence[str],
                      keeper: HistoryKeeper | None) -> None:
    """--open FILE, or --resume's kept conversation; one line on stderr says what it held."""
    if options.open and options.resume is not None:
        raise UsageError("--open and --resume both name a conversation: give one")
    if options.resume is not None:
        resume(keeper, session, options.resume)
    elif options.open:
        note = session.open(options.open)
        count = len(session.conversation.exchanges)
        print(f"llama-chat: opened {options.open}: {count} exchange{'s' * (count != 1)}, "
              f"{len(session.cache)} tokens cached" + (f"; {note}" if note else ""), file=sys.stderr)
    else:
        return
    # The conversation's saved settings, but the sampling flags given on this command line.
    session.apply_settings(given_settings(argv), "command line")


def main(argv: list[str]) -> int:
    return run_chat(chat_parser().parse_args(argv), argv)


def run_chat(options: argparse.Namespace, argv: Sequence[str] = ()) -> int:
    settle_flags(options)
    lookup = DraftLength.parse(options.lookup)
    answer_format = format_from(options)
    model_options = load_options(options)
    if options.raw:
        model_options = model_options.replaced(chat_format="plain")

    def chat(load_shard: Callable[[str], Llama]) -> int:
        prompt = read_prompt(options)
        model_path = options.model or require_default_model()
        # A one-shot reply ends long before a first compile would: it uses a compiled step
        # only if one is on disk already (or --compile wait).
        load_model = CompilingLoader(load_shard, options.compile, background=prompt is None)
        load_draft = CompilingLoader(OptionsLoader(draft_options(options)), options.compile,
                                     background=prompt is None)
        tools = tool_use_from(options)  # MCP servers start while the model loads
        try:
            system = None if options.system is None else checked_text(options.system, "--system")
            model = load_model(model_path)
            warn_about_model(model, model_options)
            system = model.default_system if system is None else system
            session = Session(model, SamplingSettings(), system=system, context_size=options.ctx_size,
                              model_path=model_path)
            configure_session(session, argv, lookup, answer_format)
            if options.draft:
                session.set_draft(load_draft(options.draft), options.draft)
            session.when_full = options.when_full
            keeper = opened_history(options.no_history)
            open_conversation(session, options, argv, keeper)
            files = read_files(session, options.file or [])
            code = converse(session, prompt, files, options, load_model, load_draft, tools, keeper)
            if options.save:
                session.save(options.save)
            return code
        finally:
            tools.close()
            load_model.stop()
            load_draft.stop()

    return run_in_group(options.tp, argv, lambda shard: OptionsLoader(model_options, shard), chat,
                        group_timeout())


def settle_flags(options: argparse.Namespace) -> None:
    """Refuse flags that cannot work together before anything loads; tensor parallelism
    (--tp, or a rank's environment) runs on the cpu."""
    settings_from(options)
    if options.ctx_size is not None and options.ctx_size <= 0:
        raise UsageError(f"--ctx-size must be a positive number of tokens, got {options.ctx_size}")
    if options.tp > 1 and options.device not in ("auto", "cpu"):
        raise UsageError(f"--tp runs on the cpu (gloo), not on {options.device}")
    if options.tp > 1 or shard_from_environment() is not None:
        options.device = "cpu"


def warn_about_model(model: Llama, model_options: LoadOptions) -> None:
    """One line on stderr each where the loaded model will not run as the user may expect:
    PyTorch's kernels instead of llama-chat's, or plain completion for want of a chat template."""
    reason = kernels_wanting(model, model_options.kernels)
    if reason:
        print(f"llama-chat: PyTorch's kernels run: {reason}", file=sys.stderr)
    if model_options.prompt_math != model.prompt_math:
        print("llama-chat: --prompt-math fast does nothing here: prompts stay exact (fast prompt math is llama-chat's "
              "kernels', which do not run this model)", file=sys.stderr)
    if model_options.chat_format is None and model.chat_format.name == "plain":
        print(f"llama-chat: {model.name} has no chat template (a base model?): replies continue the text "
              "as plain completion; --chat-format names a format for turns", file=sys.stderr)


def configure_session(
    session: Session, argv: Sequence[str], lookup: DraftLength, answer_format: AnswerFormat | None
) -> None:
    """The sampling settings, prompt lookup and answer format the session starts with."""
    # Flags first, then what is recommended for the model, then llama-chat's defaults.
    session.take_recommended_settings()
    session.apply_settings(given_settings(argv), "command line")
    session.set_lookup(lookup)
    session.set_format(answer_format)


def converse(session: Session, prompt: str | None, files: PendingFiles, options: argparse.Namespace,
             load_model: CompilingLoader, load_draft: CompilingLoader, tools: ToolUse,
             keeper: HistoryKeeper | None) -> int:
    """Answer the one prompt, or, without one, run the chat in the terminal; the exit code.
    The keeper keeps the conversation in the history."""
    if prompt is not None:
        code = answer_once(session, files.message(prompt), options.stats, options.think == "show", tools)
        keep_reply(keeper, session)
        finish_packed_cache_writes()
        finish_kernel_build()
        return code
    from llama_chat.repl.app import run_repl
    from llama_chat.repl.render import Renderer

    renderer = Renderer(show_thinking=options.think == "show")
    code = run_repl(session, load_model, load_draft=load_draft, renderer=renderer,
                    keeper=keeper, files=files, tools=tools,
                    before_input=lambda state: between_inputs(state, load_model))
    finish_packed_cache_writes()
    return code


def between_inputs(state: ChatState, load_model: CompilingLoader) -> None:
    """What the chat does before each input: moves onto kernels built since, says what
    became of a packed-cache write behind it."""
    move_onto_built_kernels(state, load_model)
    note_packed_cache_failures(state)


def read_files(session: Session, patterns: list[str]) -> PendingFiles:
    """The -f files, read for the first message (one line on stderr each); one that cannot
    be read or does not fit ends the run in one line."""
    files = PendingFiles()
    for pattern in patterns:
        for attachment in read_into(files, pattern, session):
            print(f"llama-chat: read {attachment.name}: {attachment.tokens} tokens", file=sys.stderr)
    return files


def kernels_wanting(model: Llama, kernels: KernelOptions) -> str | None:
    """Why llama-chat's kernels cannot run on this machine (no compiler, a failed build), for
    a model packed for the cpu; None where they run, are off by choice or are being built."""
    if not model.weights.packed or model.device.type != "cpu":
        return None
    state = native_state.status(kernels)
    return state.detail if state.wanting else None


def answer_once(
    session: Session, prompt: str, show_stats: bool, show_thinking: bool = False, tools: ToolUse | None = None
) -> int:
    """Stream the reply to stdout (nothing else goes there), without its thinking unless
    asked, nor the tool calls it writes; the calls (each declined unless --allow-tools
    allows it), the stats line and how long it thought to stderr."""
    runner = None
    if tools is not None:
        if tools.toolbox.servers is not None:  # a script's one reply waits for the servers' tools
            tools.toolbox.servers.wait_ready(tools.toolbox.servers.start_timeout_seconds)
        for note in tools.sync(session):
            print(f"llama-chat: {note}", file=sys.stderr)
        runner = tools.runner(session, StderrCallView())
    turn = session.send(prompt)
    if show_thinking:
        sys.stdout.write(visible(turn.prompt_thinking))
    thought = None
    for event in turn.events(runner, split_thinking=not show_thinking):
        if isinstance(event, Text):
            sys.stdout.write(visible(event.text))
            sys.stdout.flush()
        elif isinstance(event, ThoughtDone):
            thought = event.thought
        elif isinstance(event, Done):
            done = event
    sys.stdout.write("\n")
    for note in done.notes:
        print(f"llama-chat: {note}", file=sys.stderr)
    if show_stats:
        if thought is not None:
            print(thought.line(), file=sys.stderr)
        print(stats_line(done.stats, done.calls_made, done.tool_seconds), file=sys.stderr)
    return 0


class StderrCallView:
    """Tool calls of a one-shot reply, on stderr: nobody is there to ask, so only the tools
    allowed ahead run."""

    def show_call(self, call: ToolCall, tool: Tool, preview: str | None) -> None:
        print(f"llama-chat: tool call: {call_line(call, tool.spec).text}", file=sys.stderr)

    def ask(self, call: ToolCall, tool: Tool) -> Answer | None:
        print(f"llama-chat: declined {call.name}: nobody can be asked with -p; "
              f"allow it ahead with --allow-tools {call.name}", file=sys.stderr)
        return None

    def show_result(self, call: ToolCall, result: CallResult) -> None:
        if result.outcome != Outcome.DECLINED:
            print(f"llama-chat: {call.name}: {result.outcome}", file=sys.stderr)
