"""The one error family llama-chat shows to people.

Every error a user can cause (a bad setting, a missing file, an unavailable device)
is a LlamaChatError carrying a message that says what is wrong and what to do.
The CLI catches it once and prints that one line.
"""


class LlamaChatError(Exception):
    """An error with a message meant for the person using llama-chat."""


class SettingError(LlamaChatError):
    """A sampling or generation setting has a value it cannot take."""


class DeviceError(LlamaChatError):
    """The requested device or dtype cannot be used on this machine."""


class ContextOverflowError(LlamaChatError):
    """More tokens were fed than the context (the KV cache) can hold."""


class UsageError(LlamaChatError):
    """The command line asks for something impossible (exit code 2)."""


class CorruptFileError(LlamaChatError, ValueError):
    """A file llama-chat wrote itself does not read back as written (a cache, to be made
    again); a ValueError too, as which its callers catch it."""


def first_line(error: BaseException) -> str:
    """An exception as one line: its message's first line, or its type's name."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
