"""The conversation itself, as text: the system prompt and the exchanges of the version
followed (the others hang from them, see branches). Its token ids are the transcript's.

Exchanges that no longer fit the context (dropped, or compacted into a summary) stay in
`earlier`, for the file and the history; the model sees the summary instead, after the
system prompt, in the system message."""

from __future__ import annotations

from llama_chat.chat.branches import Version, switched, versions
from llama_chat.chat.exchange import Exchange, messages_of
from llama_chat.errors import LlamaChatError

SUMMARY_HEADING = "A summary of the conversation before the messages that follow: "


class Conversation:
    """The system prompt and the exchanges."""

    def __init__(self, system: str | None = None) -> None:
        self.system = system or None
        self.exchanges: list[Exchange] = []
        self.earlier: list[Exchange] = []  # out of the context, oldest first
        self.summary: str | None = None  # what stands for the compacted ones in the context

    def messages(self) -> list[dict[str, str]]:
        """System prompt (if any) and every exchange, as chat-format messages."""
        return self.system_messages() + messages_of(self.exchanges)

    def system_messages(self) -> list[dict[str, str]]:
        """The system prompt and the summary of compacted exchanges, as one system message."""
        summary = f"{SUMMARY_HEADING}{self.summary}" if self.summary else None
        content = "\n\n".join(part for part in (self.system, summary) if part)
        return [{"role": "system", "content": content}] if content else []

    def clear(self) -> None:
        """No exchange left, earlier ones and their summary gone too."""
        self.exchanges.clear()
        self.earlier.clear()
        self.summary = None

    def no_message(self, number: int) -> str:
        """Why user message `number` cannot be edited, in one line."""
        if not self.exchanges:
            return "nothing to edit yet: send a message first"
        return f"there is no message {number}: the user messages are numbered from 1 to {len(self.exchanges)}"

    def versions(self) -> list[Version]:
        """The versions at each fork of the conversation, numbered (see branches)."""
        return versions(self.exchanges)

    def follow_version(self, number: int) -> None:
        """Follow version `number` instead (LlamaChatError for one there is not, nothing changed)."""
        self.exchanges = switched(self.exchanges, number)

    def undo(self) -> Exchange:
        """Remove the last exchange (with its other versions)."""
        if not self.exchanges:
            raise LlamaChatError("nothing to undo: the conversation is empty")
        return self.exchanges.pop()
