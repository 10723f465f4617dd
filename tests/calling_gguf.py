"""A tiny GGUF model trained in the tests to call real MCP servers' tools, for the chat end to
end: asked the time in Paris, it calls get_current_time and answers with the day the
result names ("It is Saturday in Paris."); told the call was declined, it says so; asked
which folders it may read, it calls list_allowed_directories. It learns these transcripts
by heart, with the tools offered exactly as the chat will offer them."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import torch

import llama_chat
from llama_chat.chat.tool_runner import DECLINED
from llama_chat.chat.turn import NOT_ASKED
from llama_chat.text.tool_calls import ToolCall
from llama_chat.text.tools_format import ToolsFormat
from llama_chat.tools.tool import ToolSpec

from .test_gguf import VOCAB, tiny_hf_model, write_gguf
from .tool_templates import HERMES

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
TIME_QUESTION = "What day is it in Paris?"
FOLDERS_QUESTION = "Which folders may you read?"
DECLINED_ANSWER = "I could not look it up."
FOLDERS_ANSWER = "I may read one folder."


def day_answer(day: str) -> str:
    return f"It is {day} in Paris."


def time_result(day: str, date: int, hour: int) -> str:
    """What mcp-server-time answers, in its layout."""
    return json.dumps({"timezone": "Europe/Paris", "datetime": f"2026-11-{date:02d}T{hour:02d}:"
                       f"{(hour * 7) % 60:02d}:{(hour * 13) % 60:02d}+01:00", "day_of_week": day, "is_dst": False},
                      indent=2)


def _exchange(question: str, call: ToolCall, result: str, answer: str) -> list[dict]:
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [call.as_message_part()]},
        {"role": "tool", "content": result, "name": call.name, "tool_call_id": call.id},
        {"role": "assistant", "content": answer},
    ]


def transcripts(folders_result: str | None, today: str, draws: random.Random):
    """An endless stream of transcripts to learn from: mostly the time asked, with a result of
    a random date and hour (fresh each time, so that the model learns to read the day rather
    than learn results by heart), half of them today's day, the others any day; now and then
    the call declined, or the folders asked for."""
    now = ToolCall("get_current_time", {"timezone": "Europe/Paris"}, "call00001")
    listing = ToolCall("list_allowed_directories", {}, "call00001")
    for step in itertools.count():
        if step % 5 == 3:  # declined by the user, or with nobody to ask
            yield _exchange(TIME_QUESTION, now, DECLINED if step % 10 == 3 else NOT_ASKED, DECLINED_ANSWER)
        elif step % 5 == 4 and folders_result is not None:
            yield _exchange(FOLDERS_QUESTION, listing, folders_result, FOLDERS_ANSWER)
        else:
            day = today if step % 2 else draws.choice(DAYS)
            result = time_result(day, draws.randint(1, 30), draws.randint(0, 23))
            yield _exchange(TIME_QUESTION, now, result, day_answer(day))


def replies_only(chat_format: ToolsFormat, messages: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """A transcript's ids, and labels that score only what the model writes: its call and
    its answer (the prompt and the tool's result are no task of its)."""
    ids = chat_format.encode(messages, add_generation_prompt=False)
    labels = [-100] * len(ids)
    call_end = len(chat_format.encode(messages[:2], add_generation_prompt=False))
    spans = [(len(chat_format.encode(messages[:1])), call_end), (len(chat_format.encode(messages[:3])), len(ids))]
    for start, end in spans:
        labels[start:end] = ids[start:end]
    return torch.tensor([ids]), torch.tensor([labels])


def write_calling_model(
    path: Path, tools: list[ToolSpec], folders_result: str | None, today: str, steps: int = 1200
) -> Path:
    """Train a tiny model on the transcripts with `tools` offered, and write it as a GGUF file
    with the family template it learned (a minute or less)."""
    model = tiny_hf_model(vocab_size=len(VOCAB), hidden_size=96, intermediate_size=192,
                          max_position_embeddings=2048, seed=1)
    untrained = write_gguf(path, model, chat_template=HERMES)
    chat_format = ToolsFormat(llama_chat.load(untrained, device="cpu").chat_format, tools)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    model.train()
    for messages in itertools.islice(transcripts(folders_result, today, random.Random(1)), steps):
        tokens, labels = replies_only(chat_format, messages)
        optimizer.zero_grad()
        model(input_ids=tokens, labels=labels).loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    return write_gguf(path, model, chat_template=HERMES)
