"""A reply's text as it is shown while it streams: the tool calls it writes are left out
(the front end shows each call its own way, and asks about it)."""

from __future__ import annotations

from llama_chat.text.tool_calls import CallSyntax

_PYTHON_TAG = "<|python_tag|>"


class CallText:
    """Text pieces in, the text before the first call out; what may be the start of the
    call's opening waits for the next piece. `reset` starts the next round."""

    def __init__(self, syntax: CallSyntax) -> None:
        self.opening = syntax.opening
        self.reset()

    def reset(self) -> None:
        self.pending = ""
        self.in_call = False
        self.started = False  # the round's text is known to be no call (llama3: it does not open with JSON)

    def feed(self, text: str) -> str:
        if self.in_call:
            return ""
        self.pending += text
        if not self.opening:
            return self._unless_json()
        start = self.pending.find(self.opening)
        if start >= 0:
            self.in_call = True
            shown, self.pending = self.pending[:start], ""
            return shown
        held = next((length for length in range(min(len(self.opening) - 1, len(self.pending)), 0, -1)
                     if self.pending.endswith(self.opening[:length])), 0)
        shown, self.pending = self.pending[: len(self.pending) - held], self.pending[len(self.pending) - held:]
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
        shown, self.pending = ("" if self.in_call else self.pending), ""
        return shown
