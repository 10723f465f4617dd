"""The tools a conversation's replies may call: the specs the model is shown, the family its
calls are written in, the grammar that holds them, and what bounds a turn's calls and
their results."""

from __future__ import annotations

from dataclasses import dataclass

from llama_chat.engine.constraint import AnswerFormat
from llama_chat.text.chat_format import ChatFormat
from llama_chat.text.tokenizer import Tokenizer
from llama_chat.text.tool_calls import CallSyntax, ToolChoice, call_grammar
from llama_chat.text.tools_format import ToolsFormat
from llama_chat.tools.tool import ToolSpec

MAX_CALLS = 8  # calls one turn may make: a model that calls in a loop is stopped there
# A result is cut to this share of the context (at most RESULT_TOKENS), so that one large
# file or listing cannot fill the context alone.
RESULT_TOKENS = 4096
RESULT_SHARE = 4


@dataclass(frozen=True)
class ToolOffer:
    """Tools offered to a model whose calls are written as `syntax` says."""

    tools: tuple[ToolSpec, ...]
    syntax: CallSyntax
    max_calls: int = MAX_CALLS
    required: bool = False  # a turn's first round must call (later ones answer with the results)

    def chat_format(self, base: ChatFormat) -> ToolsFormat:
        """The conversation's format with these tools in it."""
        return ToolsFormat(base, self.tools, self.syntax)

    def constraint_format(self, tokenizer: Tokenizer, choice: ToolChoice) -> AnswerFormat:
        """What a round's tokens follow: text or calls to these tools, as `choice` says."""
        grammar = call_grammar(self.syntax, self.tools, tokenizer, choice)
        return AnswerFormat("grammar", grammar, source="the tool calls' grammar")

    def choice(self, round_number: int, calls_made: int) -> ToolChoice:
        """What round `round_number` (from 0) of a turn that made `calls_made` calls may do."""
        if calls_made >= self.max_calls:
            return ToolChoice.NONE
        return ToolChoice.REQUIRED if self.required and round_number == 0 else ToolChoice.AUTO

    def names(self) -> list[str]:
        return [tool.name for tool in self.tools]


def result_budget(capacity: int) -> int:
    """The tokens one result may take in a context of `capacity` tokens."""
    return max(64, min(RESULT_TOKENS, capacity // RESULT_SHARE))


def fitted(text: str, tokenizer: Tokenizer, budget: int) -> str:
    """`text` cut to `budget` tokens, with a line saying how much was left out."""
    ids = tokenizer.encode(text)
    if len(ids) <= budget:
        return text
    kept = tokenizer.decode(ids[:budget])
    left = len(text) - len(kept)
    return f"{kept}\n[the result was cut to {budget} tokens here: {left:,} more characters were left out]"
