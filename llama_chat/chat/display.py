"""Text as a front end prints it: a reply with its control characters made visible, a
stranger's text with every character that does not print escaped, and the statistics line."""

from __future__ import annotations

import re

from llama_chat.engine.generation import GenerationStats, StopReason

# C0 and C1 control characters other than newline and tab: a reply must never steer the terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Characters Unicode calls default-ignorable that str.isprintable() counts as printable: they
# print as nothing (the combining grapheme joiner, Hangul fillers, variation selectors).
_BLANK = re.compile("[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]")

_ENDINGS = {
    StopReason.INTERRUPTED: "interrupted",
    StopReason.MAX_TOKENS: "max tokens reached",
    StopReason.CONTEXT_FULL: "context full",
}


def visible(text: str) -> str:
    """Model output made safe to print: control characters shown as escapes, not obeyed."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def literal(text: str, keep: str = "") -> str:
    """A stranger's text as it is spelt, for a person to judge (a name, a tool call): every
    character that does not print or prints as nothing (control, format, bidirectional, line
    and paragraph separators, spaces other than " ", private-use, unassigned, surrogates)
    written as its escape (\\x1b, \\u202e, \\U000f0001), never obeyed; those in `keep` stay."""
    if text.isprintable() and not _BLANK.search(text):
        return text
    return "".join(character if character in keep or (character.isprintable() and not _BLANK.match(character))
                   else _escape(character) for character in text)


def _escape(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def stats_line(stats: GenerationStats, tool_calls: int = 0, tool_seconds: float = 0.0) -> str:
    """One line: how the reply ended (if not by itself), speed, the prompt's cache use, and
    the tool calls it made with the time they took (apart from the generation's)."""
    ending = _ENDINGS.get(stats.stop_reason)
    line = (
        f"{stats.generated_tokens} tokens, {stats.decode_tokens_per_second:.1f} tok/s, "
        f"first token {stats.time_to_first_token * 1000:.0f} ms, prompt {stats.prefilled_tokens} new "
        f"+ {stats.reused_tokens} cached tokens"
    )
    if stats.drafted_tokens:
        line += (f", drafted {stats.drafted_tokens}, accepted {stats.accepted_tokens} "
                 f"({stats.accepted_tokens / stats.drafted_tokens:.0%})")
    if stats.constraint_masks:
        line += (f", format {stats.constraint_seconds_per_token * 1000:.2f} ms/token "
                 f"({stats.constraint_share:.1%} of a step)")
    if tool_calls:
        line += f", {tool_calls} tool call{'s' * (tool_calls != 1)} ({tool_seconds:.1f} s)"
    return f"[{ending}] {line}" if ending else line
