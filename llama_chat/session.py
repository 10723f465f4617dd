"""A conversation with a model: its messages, and a KV cache reused from turn to turn."""

from __future__ import annotations

from .generate import Generation
from .llama import Llama
from .sampling import SamplingSettings


class Session:
    """Messages plus the cache that holds their tokens.

    Each turn renders the whole conversation through the model's chat format; the
    generation reuses the longest prefix the cache already holds, so only the new
    message (and the end of the previous reply) goes through the model.
    """

    def __init__(
        self,
        model: Llama,
        settings: SamplingSettings | None = None,
        *,
        system: str | None = None,
        context_size: int | None = None,
    ) -> None:
        self.model = model
        self.settings = settings or SamplingSettings()
        self.system = system
        self.messages: list[dict[str, str]] = []
        self.cache = model.new_cache(context_size)

    def conversation(self) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.messages

    def send(self, text: str) -> Generation:
        """Add a user message and return the streaming reply; call `record` when it ends."""
        prompt = self.model.chat_format.encode(self.conversation() + [{"role": "user", "content": text}])
        generation = self.model.generate(prompt, self.settings, cache=self.cache)
        self.messages.append({"role": "user", "content": text})
        return generation

    def record(self, generation: Generation) -> None:
        """Keep the reply (complete or interrupted) as the assistant's message."""
        self.messages.append({"role": "assistant", "content": generation.text})
