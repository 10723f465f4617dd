"""Where llama-chat keeps things on disk: weights, cached measurements and packages, history.

Each folder follows the XDG base directories unless an environment variable names it.
"""

from __future__ import annotations

import os
from pathlib import Path

from llama_chat.errors import LlamaChatError


def user_directory(variable: str, default: str) -> Path:
    """llama-chat's folder under an XDG base directory: $variable, else ~/default."""
    return Path(os.environ.get(variable) or Path.home() / default) / "llama-chat"


def weights_dir() -> Path:
    """$LLAMA_CHAT_WEIGHTS, else the checkout's weights/ folder, else the user's data folder."""
    if os.environ.get("LLAMA_CHAT_WEIGHTS"):
        return Path(os.environ["LLAMA_CHAT_WEIGHTS"])
    checkout = Path(__file__).resolve().parent.parent / "weights"
    if (checkout / "README.md").is_file():
        return checkout
    return user_directory("XDG_DATA_HOME", ".local/share") / "weights"


def cache_root() -> Path | None:
    """Where measurements worth keeping go: $LLAMA_CHAT_CACHE ("off" for nowhere), else
    $XDG_CACHE_HOME/llama-chat or ~/.cache/llama-chat."""
    configured = os.environ.get("LLAMA_CHAT_CACHE")
    if configured == "off":
        return None
    if configured:
        return Path(configured)
    return user_directory("XDG_CACHE_HOME", ".cache")


def history_path() -> Path:
    """$XDG_STATE_HOME/llama-chat/history (~/.local/state when the variable is not set)."""
    return user_directory("XDG_STATE_HOME", ".local/state") / "history"


def kept_conversation_path() -> Path:
    """$XDG_STATE_HOME/llama-chat/conversation.json: the chat's current conversation, kept
    after every input for --resume."""
    return user_directory("XDG_STATE_HOME", ".local/state") / "conversation.json"


def expanded(path: str | Path) -> Path:
    """The path with ~ or ~user expanded; an unknown user is one clear error."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise LlamaChatError(f"cannot expand {path}: no such user") from None
