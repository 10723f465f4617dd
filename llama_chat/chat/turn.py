"""One reply being generated, and how it joins the conversation as an exchange."""

from __future__ import annotations

from collections.abc import Callable

from llama_chat.chat.branches import fork
from llama_chat.chat.conversation_ids import TurnPlan, exchange_ids
from llama_chat.chat.exchange import Exchange
from llama_chat.chat.running_model import RunningModel
from llama_chat.chat.thinking import cue_opening
from llama_chat.engine.generation import Generation, GenerationStats, Piece, StopReason
from llama_chat.engine.sampling import SamplingSettings


class Turn:
    """One reply being generated. `run()` streams it; however it ends (done, Ctrl-C, an
    error) it is then handed to `record` as an exchange, with its statistics."""

    def __init__(
        self, running: RunningModel, settings: SamplingSettings, record: Callable[[Exchange, GenerationStats], None],
        text: str, plan: TurnPlan, dropped: int, replaced: list[Exchange] | None = None,
    ) -> None:
        self.model = running.model
        self.record = record  # where the finished exchange goes: the conversation
        self.user = text
        self.plan = plan
        self.dropped = dropped  # oldest exchanges dropped to make room for this turn
        self.replaced = replaced  # the exchanges this turn starts a new version of (/retry, /edit)
        processors = [running.format.start(running.model.tokenizer)] if running.format is not None else []
        self.generation: Generation = running.model.generate(
            plan.prompt, settings, cache=running.cache, speculation=running.speculation, processors=processors
        )
        # The opening thinking marker when the template's cue wrote it: the reply starts
        # inside the thinking, and is kept with the marker, whole.
        self.thinking_cue = cue_opening(running.model.tokenizer, plan.prompt)
        self.exchange: Exchange | None = None

    @property
    def prompt(self) -> list[int]:
        return self.plan.prompt

    @property
    def text(self) -> str:
        return self.generation.text

    @property
    def stats(self) -> GenerationStats:
        return self.generation.stats

    def run(self, on_piece: Callable[[Piece], None] | None = None) -> Exchange:
        """Generate the reply, passing each piece to on_piece; exceptions (KeyboardInterrupt)
        pass through after the partial reply is recorded."""
        try:
            for piece in self.generation:
                if on_piece is not None:
                    on_piece(piece)
        finally:
            self.finish()
        return self.exchange

    def finish(self) -> Exchange:
        """Record the reply as it stands (interrupted if generation did not reach its end)."""
        if self.exchange is None:
            generation = self.generation
            reply = self.thinking_cue + generation.text
            model = self.model
            user_ids, reply_ids = exchange_ids(
                model.chat_format, model.stop_ids, self.plan, self.user, reply, generation.tokens
            )
            self.exchange = Exchange(
                user=self.user,
                reply=reply,
                interrupted=generation.stats.stop_reason == StopReason.INTERRUPTED,
                user_ids=user_ids,
                reply_ids=reply_ids,
            )
            if self.replaced:
                fork(self.replaced, self.exchange)
            self.record(self.exchange, generation.stats)
        return self.exchange
