"""One reply being generated, and how it joins the conversation as an exchange.

With tools offered, a reply may go in rounds: the model writes calls and stops; the tool
runner the turn was given asks, runs them and puts a result to each; the results go to the
model and the reply goes on. A turn makes at most `ToolOffer.max_calls` calls: past them the
last round may not open a call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from llama_chat.chat.branches import fork
from llama_chat.chat.events import Done, Event, RoundText, ToolCalls
from llama_chat.chat.exchange import CallResult, Exchange, Outcome, ToolRound
from llama_chat.chat.running_model import RunningModel
from llama_chat.chat.thinking import thinking_opened_by_prompt
from llama_chat.chat.tool_offer import ToolOffer, fitted, result_budget
from llama_chat.chat.transcript import Prompt, Transcript
from llama_chat.engine.generation import Generation, GenerationStats, StopReason
from llama_chat.engine.processors import LogitsProcessor
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.text.tool_calls import CallReadError, CallSyntax, ReadReply, read_calls

STOPPED = "the user stopped this call before it finished"
NOT_ASKED = "this tool call was not run: nobody could be asked to allow it"
RunCalls = Callable[[ToolRound, int, int], None]  # puts a result to each call of a round (chat/tool_runner)


class Turn:
    """One reply being generated. `events()` streams it; however it ends (done, Ctrl-C, an
    error) it is then handed to `record` as an exchange, with its statistics."""

    def __init__(
        self, running: RunningModel, settings: SamplingSettings, record: Callable[[Exchange, GenerationStats], None],
        text: str, prompt: Prompt, dropped: int, replaced: list[Exchange] | None = None, *,
        transcript: Transcript, offer: ToolOffer | None = None, first_call: int = 1,
        compacted: tuple[int, int, int] | None = None,
    ) -> None:
        self.running = running
        self.model = running.model
        self.settings = settings
        self.record = record  # where the finished exchange goes: the conversation
        self.user = text
        self.transcript = transcript  # the conversation's ids, which the reply's join
        self.prompts = [prompt]  # one a round
        self.dropped = dropped  # oldest exchanges dropped to make room for this turn
        self.compacted = compacted  # exchanges compacted for it, and the context's tokens before and after
        self.replaced = replaced  # the exchanges this turn starts a new version of (/retry, /edit)
        # Tools, unless a format holds the reply (which leaves no room for a call).
        self.offer = offer if running.format is None else None
        self.next_call = first_call  # the number of the conversation's next call
        self.rounds: list[ToolRound] = []
        self.notes: list[str] = []  # what the front end should say of the turn (a call cut off)
        self.generations: list[Generation] = []
        self.generation = self._generate(prompt.ids)
        # The opening thinking marker when the template's generation prompt wrote it: the reply starts
        # inside the thinking, and is kept with the marker, whole.
        self.prompt_thinking = thinking_opened_by_prompt(running.model.tokenizer, prompt.ids)
        self.exchange: Exchange | None = None

    @property
    def prompt(self) -> list[int]:
        return self.prompts[0].ids

    @property
    def text(self) -> str:
        return self.generation.text

    @property
    def calls_made(self) -> int:
        return sum(len(tool_round.calls) for tool_round in self.rounds)

    @property
    def tool_seconds(self) -> float:
        return sum(result.seconds for tool_round in self.rounds for result in tool_round.results)

    @property
    def stats(self) -> GenerationStats:
        """The reply's statistics, its rounds summed (the prompt's as the first round's)."""
        first, *later = [generation.stats for generation in self.generations]
        total = dataclasses.replace(first)
        for stats in later:
            for name in ("prefill_seconds", "generated_tokens", "decode_seconds", "drafted_tokens",
                         "accepted_tokens", "constraint_seconds", "constraint_masks"):
                setattr(total, name, getattr(total, name) + getattr(stats, name))
            total.stop_reason = stats.stop_reason
        return total

    @property
    def done(self) -> Done:
        """The reply's end as an event: its statistics, notes and calls."""
        return Done(self.stats, list(self.notes), self.calls_made, self.tool_seconds)

    def events(self, tools: RunCalls | None = None, split_thinking: bool = True) -> Iterator[Event]:
        """The reply as it streams: its text and thinking (apart unless `split_thinking` is
        off), each round of calls (then run by `tools`, told how many the turn may still make
        and its limit: `tools(round, allowed, limit)`; without it every call is declined), and
        Done. However it ends it is recorded; Ctrl-C while a round streams gives what it held
        back and Done before it passes through."""
        text = RoundText(self._syntax, bool(self.prompt_thinking), split_thinking)
        try:
            while True:
                for piece in self.generation:
                    yield from text.feed(piece)
                yield from text.end()
                tool_round = self._round_of_calls()
                if tool_round is None:
                    break
                yield ToolCalls(tool_round)
                self._run_calls(tool_round, tools)
                self._next_round(tool_round)
                text = RoundText(self._syntax, False, split_thinking)
        except KeyboardInterrupt:
            self.finish()
            if not text.ended:
                yield from text.end()
                yield self.done
            raise
        finally:
            self.finish()
        yield self.done

    def run(self, tools: RunCalls | None = None) -> Exchange:
        """Generate the whole reply (its calls run by `tools`, see events); the exchange."""
        for _ in self.events(tools):
            pass
        return self.exchange

    @property
    def _syntax(self) -> CallSyntax | None:
        return self.offer.syntax if self.offer is not None else None

    def _run_calls(self, tool_round: ToolRound, tools: RunCalls | None) -> None:
        """A result to each call: run by `tools` as far as the turn's limit allows, the rest
        declined (or stopped, by Ctrl-C)."""
        allowed = max(0, self.offer.max_calls - self.calls_made)
        self.rounds.append(tool_round)
        try:
            if tools is not None:
                tools(tool_round, allowed, self.offer.max_calls)
        except BaseException:
            self._answer_the_rest(tool_round, CallResult(STOPPED, Outcome.CANCELLED))
            raise
        self._answer_the_rest(tool_round, CallResult(NOT_ASKED, Outcome.DECLINED))

    def _generate(self, prompt: list[int]) -> Generation:
        tokenizer = self.model.tokenizer
        processor: LogitsProcessor | None = None
        stops = self.model.stop_ids
        if self.running.format is not None:
            processor = self.running.format.start(tokenizer, stops)
        elif self.offer is not None:
            choice = self.offer.choice(len(self.rounds), self.calls_made)
            processor = self.offer.constraint_format(tokenizer, choice).start(tokenizer, stops)
        generation = self.model.generate(
            prompt, self.settings, cache=self.running.cache, speculation=self.running.speculation,
            processor=processor,
        )
        self.generations.append(generation)
        return generation

    def _round_of_calls(self) -> ToolRound | None:
        """The calls the round just generated wrote, if any (not when it was cut short)."""
        generation = self.generation
        if self.offer is None or generation.stats.stop_reason == StopReason.INTERRUPTED:
            return None
        read = self._read(generation)
        if not read.calls:
            return None
        opened = self.prompt_thinking if not self.rounds else ""
        self.next_call += len(read.calls)
        return ToolRound(opened + read.text, list(read.calls))

    def _read(self, generation: Generation) -> ReadReply:
        syntax = self.offer.syntax
        tokenizer = self.model.tokenizer
        opening = tokenizer.token_id(syntax.opening) if syntax.opening else None
        if opening is not None and tokenizer.token_bytes(opening) is None and opening not in generation.tokens:
            return ReadReply(generation.text)  # the opening spelt out in text is no call
        try:
            return read_calls(syntax, generation.text, self.next_call)
        except CallReadError as error:
            self.notes.append(f"the reply's tool call was not run: {error} ({generation.stats.stop_reason})")
            return ReadReply(generation.text)

    def _answer_the_rest(self, tool_round: ToolRound, missing: CallResult) -> None:
        """`missing` for every call that has no result (stopped by Ctrl-C, or nobody asked),
        and each result cut to the budget."""
        tool_round.results += [missing] * (len(tool_round.calls) - len(tool_round.results))
        budget = result_budget(self.running.capacity)
        tokenizer = self.model.tokenizer
        tool_round.results[:] = [
            dataclasses.replace(result, text=fitted(result.text, tokenizer, budget)) for result in tool_round.results
        ]

    def _next_round(self, tool_round: ToolRound) -> None:
        prompt = self.transcript.append_round(self.prompts[-1], self.generation.tokens, tool_round)
        self.prompts.append(prompt)
        self.generation = self._generate(prompt.ids)

    def finish(self) -> Exchange:
        """Record the reply as it stands (interrupted if generation did not reach its end)."""
        if self.exchange is None:
            generation = self.generation
            # Stopped while its calls ran: the round holds what the last generation wrote,
            # and the reply never came (its ids are rendered anew next turn).
            stopped_in_calls = len(self.rounds) == len(self.prompts)
            reply = "" if stopped_in_calls else (self.prompt_thinking if not self.rounds else "") + generation.text
            interrupted = stopped_in_calls or generation.stats.stop_reason == StopReason.INTERRUPTED
            exchange = Exchange(user=self.user, reply=reply, interrupted=interrupted, rounds=self.rounds)
            if not stopped_in_calls:
                self.transcript.append_reply(self.prompts[-1], exchange, generation.tokens)
            self.exchange = exchange
            if self.replaced:
                fork(self.replaced, exchange)
            self.record(exchange, self.stats)
        return self.exchange
