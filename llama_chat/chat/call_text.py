"""A reply's text as it is shown while it streams: the tool calls it writes are left out
(the front end shows each call its own way, and asks about it)."""

from __future__ import annotations

from llama_chat.text.held_prefix import HeldPrefix
from llama_chat.text.tool_calls import CallSyntax

_PYTHON_TAG = "<|python_tag|>"


class CallText:
    """Text pieces in, the text before the first call out; what may be the start of the
    call's opening waits for the next piece. One a round."""

    def __init__(self, syntax: CallSyntax) -> None:
        self.opening = syntax.opening
        self.held = HeldPrefix([self.opening])
        self.pending = ""  # a family with no opening: the round's start, until it is known to be no call
        self.in_call = False
        self.started = False  # the round's text is known to be no call (llama3: it does not open with JSON)

    def feed(self, text: str) -> str:
        if self.in_call:
            return ""
        if not self.opening:
            self.pending += text
            return self._unless_json()
        shown, opening = self.held.feed(text)
        self.in_call = opening is not None
        return shown

    def _unless_json(self) -> str:
        """A family whose call is the whole reply: nothing is shown of a reply that opens as one."""
        if not self.started:
            start = self.pending.lstrip()
            if not start:
                return ""
            if start.startswith("{") or start.startswith(_PYTHON_TAG):
                self.in_call = True
                self.pending = ""
                return ""
            self.started = True
        shown, self.pending = self.pending, ""
        return shown

    def flush(self) -> str:
        """At the round's end: what was held back, unless a call began."""
        shown = "" if self.in_call else self.pending + self.held.release()
        self.pending = ""
        return shown
