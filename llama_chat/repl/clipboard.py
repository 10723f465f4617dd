"""Copying text to the clipboard through the terminal: the OSC 52 escape sequence, which
the terminal itself acts on, so it works over SSH and inside tmux (with its set-clipboard
option on) where no clipboard program could reach the user's desktop.

Terminals that ignore the sequence show nothing, so the chat says when the terminal is
not one known to accept it.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping

# Fenced code blocks in Markdown: ``` or ~~~ (with an optional language), up to the same fence.
_FENCED = re.compile(r"^(?P<fence>```+|~~~+)[^\n]*\n(?P<code>.*?)^(?P=fence)[ \t]*$", re.MULTILINE | re.DOTALL)

# Terminals known to act on OSC 52, by the variables they set.
_KNOWN_PROGRAMS = {"iTerm.app", "WezTerm", "vscode", "ghostty", "Hyper", "tmux"}
_KNOWN_TERMS = ("xterm-kitty", "alacritty", "foot", "xterm-ghostty", "wezterm", "tmux", "contour")
_KNOWN_VARIABLES = ("TMUX", "KITTY_WINDOW_ID", "WT_SESSION", "ALACRITTY_WINDOW_ID", "WEZTERM_PANE")


def osc52(text: str) -> str:
    """The sequence that puts `text` on the system clipboard ("c")."""
    return f"\x1b]52;c;{base64.b64encode(text.encode()).decode()}\a"


def last_code_block(text: str) -> str | None:
    """The contents of the last fenced code block in `text` (no fences), or None."""
    blocks = list(_FENCED.finditer(text))
    return blocks[-1]["code"] if blocks else None


def known_to_accept(environment: Mapping[str, str] = os.environ) -> bool:
    """Whether the terminal these variables describe is one known to act on OSC 52."""
    if any(environment.get(name) for name in _KNOWN_VARIABLES):
        return True
    return (environment.get("TERM_PROGRAM") in _KNOWN_PROGRAMS
            or environment.get("TERM", "").startswith(_KNOWN_TERMS))
