"""Where llama-chat keeps things on disk: weights, cached measurements and packages, history.

Each folder follows the XDG base directories unless the program that started names
another (`configure`, from the LLAMA_CHAT_* variables, which environment.py reads).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from llama_chat import environment
from llama_chat.errors import LlamaChatError
from llama_chat.options import DataFolders

# Set once where a program starts (cli/options.py); a library caller gets the standard folders.
_folders = DataFolders()


def configure(folders: DataFolders) -> DataFolders:
    """Use these folders from now on; the ones used until now."""
    global _folders
    previous, _folders = _folders, folders
    return previous


def user_directory(variable: str, default: str) -> Path:
    """llama-chat's folder under an XDG base directory: $variable, else ~/default."""
    return Path(environment.user_base(variable) or Path.home() / default) / "llama-chat"


def weights_dir() -> Path:
    """The folder configured (LLAMA_CHAT_WEIGHTS), else the checkout's weights/ folder, else
    the user's data folder."""
    if _folders.weights is not None:
        return _folders.weights
    checkout = Path(__file__).resolve().parent.parent / "weights"
    if (checkout / "README.md").is_file():
        return checkout
    return user_directory("XDG_DATA_HOME", ".local/share") / "weights"


_unwritable: set[Path] = set()  # cache folders found unwritable (each reported once)


def cache_root() -> Path | None:
    """Where measurements worth keeping go: the folder configured (LLAMA_CHAT_CACHE; None
    when it is off), else $XDG_CACHE_HOME/llama-chat or ~/.cache/llama-chat. None too for a
    folder that cannot be created or written: the first time, one line on stderr says so,
    and everything runs without the cache (built kernels, compiled steps, packed weights,
    measurements)."""
    if _folders.cache_off:
        return None
    root = _folders.cache or user_directory("XDG_CACHE_HOME", ".cache")
    if root in _unwritable:
        return None
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as error:
        _unwritable.add(root)
        print(f"llama-chat: the cache folder {root} cannot be written ({error.strerror or error}); running without "
              "it (set LLAMA_CHAT_CACHE to another folder)", file=sys.stderr)
        return None
    return root


def kernels_folder() -> Path | None:
    """Where llama-chat's kernels are built: the folder configured, else kernels/ in the
    cache folder (None while the cache is off)."""
    if _folders.kernels is not None:
        return _folders.kernels
    root = cache_root()
    return None if root is None else root / "kernels"


def history_path() -> Path:
    """$XDG_STATE_HOME/llama-chat/history (~/.local/state when the variable is not set)."""
    return user_directory("XDG_STATE_HOME", ".local/state") / "history"


def kept_conversation_path() -> Path:
    """$XDG_STATE_HOME/llama-chat/conversation.json: where llama-chat kept the chat's last
    conversation for --resume before the history (moved into the history when found)."""
    return user_directory("XDG_STATE_HOME", ".local/state") / "conversation.json"


def history_caches_path() -> Path:
    """$XDG_STATE_HOME/llama-chat/caches: the KV caches of recent conversations in the history."""
    return user_directory("XDG_STATE_HOME", ".local/state") / "caches"


def history_database_path() -> Path:
    """$XDG_STATE_HOME/llama-chat/history.sqlite3: the conversations kept to list, search
    and resume (`llama-chat history`)."""
    return user_directory("XDG_STATE_HOME", ".local/state") / "history.sqlite3"


def mcp_config_path() -> Path:
    """$XDG_CONFIG_HOME/llama-chat/mcp.json (~/.config when the variable is not set): the MCP
    servers whose tools the chat offers."""
    return user_directory("XDG_CONFIG_HOME", ".config") / "mcp.json"


def expanded(path: str | Path) -> Path:
    """The path with ~ or ~user expanded; an unknown user is one clear error."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise LlamaChatError(f"cannot expand {path}: no such user") from None

