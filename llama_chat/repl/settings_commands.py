"""Slash commands for settings: the sampling settings (each a command with one number),
/seed, the renderer's switches (/markdown, /think), and /settings, which shows them all."""

from __future__ import annotations

import dataclasses

from llama_chat.engine.sampling import SETTING_HELP, SamplingSettings
from llama_chat.repl.chat_state import ChatState, Command, CommandError, parse_number
from llama_chat.repl.render import Renderer
from llama_chat.repl.reply_commands import describe_format, describe_lookup

# Sampling settings, each a command with one number: (field, kind, argument name, help, aliases).
_ALIASES = {"temperature": ("temp",)}
SETTINGS = [
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
    state.renderer.line(f"system = {session.conversation.system!r}")
    state.renderer.line(f"context = {session.capacity} tokens, chat format {session.model.chat_format.name}")
    for name in SWITCHES:
        state.renderer.line(f"{name} = {switch_value(state.renderer, name)}")
    draft = session.speculation.draft
    state.renderer.line(f"draft = {draft.path or draft.model.name}" if draft else "draft = off")
    drafts_instead = " (the draft model drafts instead)" if draft else ""
    state.renderer.line(f"lookup = {describe_lookup(session.speculation)}{drafts_instead}")
    state.renderer.line(f"format = {describe_format(session)}")
    state.renderer.line(f"prompt math = {session.model.prompt_math}")


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
