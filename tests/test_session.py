import json
from contextlib import closing

import pytest
import torch

from llama_chat import Llama, ModelArgs, SamplingSettings
from llama_chat.chat.session import Session
from llama_chat.engine.cache import KVCache
from llama_chat.errors import ContextOverflowError, LlamaChatError
from llama_chat.text.format_choice import get_chat_format
from llama_chat.text.tokenizer import ByteTokenizer

SPECIALS = {
    "chatml": ["<|im_start|>", "<|im_end|>", "<s>", "</s>"],
    "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<s>", "</s>"],
    "llama2": ["<s>", "</s>"],
    "plain": ["<s>", "</s>"],
}
GREEDY = SamplingSettings(temperature=0, max_tokens=6)


def chat_model(format_name: str = "chatml", *, seed: int = 0, max_seq_len: int = 512, template: str | None = None,
               name: str = "tiny") -> Llama:
    """A tiny random model whose byte tokenizer has the format's control tokens."""
    tokenizer = ByteTokenizer(SPECIALS.get(format_name, SPECIALS["chatml"]))
    args = ModelArgs(dim=48, n_layers=2, n_heads=6, n_kv_heads=2, vocab_size=tokenizer.vocab_size,
                     hidden_dim=80, max_seq_len=max_seq_len)
    random = Llama.random(args, tokenizer, seed=seed)
    chat_format = get_chat_format(format_name, tokenizer, template, special_tokens=tokenizer.specials)
    return Llama(random.transformer, tokenizer, name=name, chat_format=chat_format)


def say(session: Session, text: str):
    turn = session.send(text)
    turn.run()
    return turn


def assert_consistent(session: Session) -> None:
    """The kept ids are known and the cache holds a prefix of them."""
    ids = session.transcript.ids
    assert ids is not None
    assert session.cache.tokens == ids[: len(session.cache.tokens)]


def replay(model: Llama, user_texts, settings=GREEDY, system=None) -> Session:
    """A fresh session that went through the same user messages."""
    session = Session(model, settings, system=system)
    for text in user_texts:
        say(session, text)
    return session


def new_turn_ids(format_name: str, tokenizer: ByteTokenizer, text: str) -> tuple[list[int], list[int]]:
    """(end-of-turn ids closing a reply, ids of a new user turn with the generation prompt), by hand."""
    ids = tokenizer.token_id
    encode = tokenizer.encode
    if format_name == "chatml":
        start, end = ids("<|im_start|>"), ids("<|im_end|>")
        return [end, *b"\n"], [start, *encode(f"user\n{text}"), end, *b"\n", start, *b"assistant\n"]
    if format_name == "llama3":
        start, end, eot = ids("<|start_header_id|>"), ids("<|end_header_id|>"), ids("<|eot_id|>")
        return [eot], [start, *b"user", end, *b"\n\n", *encode(text), eot, start, *b"assistant", end, *b"\n\n"]
    return [tokenizer.eos_id], [tokenizer.bos_id, *encode(f"[INST] {text} [/INST]")]


@pytest.mark.parametrize("format_name", ["chatml", "llama3", "llama2"])
def test_a_later_turn_prefills_only_its_own_message(format_name):
    session = Session(chat_model(format_name), GREEDY, system="Be brief.")
    first = say(session, "hello")
    kept = session.transcript.ids
    cached = len(session.cache.tokens)
    second = say(session, "world")
    closing, user_turn = new_turn_ids(format_name, session.model.tokenizer, "world")
    # The reply's last token is fed only when another is wanted: unless a stop token ended
    # the reply, it goes in with the new turn.
    unfed = 0 if first.stats.stop_reason == "stop_token" else 1
    assert second.stats.reused_tokens == cached == len(kept) - len(closing) - unfed
    assert second.stats.prefilled_tokens == unfed + len(closing) + len(user_turn)
    assert second.prompt == kept + user_turn
    # The reply is kept as generated, then the format's end of turn.
    assert session.transcript.spans.get(session.conversation.exchanges[0]).reply == first.generation.tokens + closing
    assert_consistent(session)


def test_third_turn_also_prefills_only_the_new_message():
    session = Session(chat_model(), GREEDY)
    say(session, "one")
    say(session, "two")
    cached = len(session.cache.tokens)
    third = say(session, "three")
    closing, user_turn = new_turn_ids("chatml", session.model.tokenizer, "three")
    assert third.stats.reused_tokens == cached
    assert third.stats.prefilled_tokens == len(third.prompt) - cached <= 1 + len(closing) + len(user_turn)


def test_a_template_that_rewrites_history_gets_the_whole_conversation_rendered():
    # Earlier replies are left out of the rendering: no prefix property after turn 1.
    template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    model = chat_model("template", template=template)
    session = Session(model, GREEDY)
    say(session, "one")
    second = say(session, "two")
    messages = [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    assert second.prompt == model.chat_format.encode(messages)
    assert second.stats.reused_tokens > 0  # the common prefix still comes from the cache
    assert len(session.conversation.exchanges) == 2 and session.transcript.ids is None


def test_plain_format_rerenders_and_keeps_going():
    session = Session(chat_model("plain"), GREEDY)
    say(session, "Once upon")
    turn = say(session, " a time")
    assert turn.prompt == session.model.chat_format.encode(session.conversation.messages()[:3])
    assert len(session.conversation.exchanges) == 2


def test_ctrl_c_keeps_the_partial_reply_and_a_consistent_cache():
    model = chat_model()
    session = Session(model, SamplingSettings(temperature=0, max_tokens=12))
    shown = []
    turn = session.send("hello")
    with pytest.raises(KeyboardInterrupt), closing(turn.events()) as events:
        for event in events:  # Ctrl-C while the third piece of text is drawn
            shown.append(event)
            if len(shown) == 3:
                raise KeyboardInterrupt
    exchange = session.conversation.exchanges[-1]
    assert exchange.interrupted and exchange.user == "hello"
    # Nothing was generated past what was shown, and all of it is kept.
    assert model.tokenizer.decode(turn.generation.tokens) == exchange.reply == "".join(event.text for event in shown)
    assert_consistent(session)
    # The next turn answers the conversation exactly as a fresh cache would.
    following = say(session, "go on")
    fresh = model.generate(following.prompt, session.settings, cache=model.new_cache())
    list(fresh)
    assert following.generation.tokens == fresh.tokens
    assert following.stats.prefilled_tokens < 40


def test_overflow_drops_the_oldest_exchanges_and_keeps_the_system_prompt():
    model = chat_model(max_seq_len=128)
    session = Session(model, SamplingSettings(temperature=0, max_tokens=8), system="Be kind.", context_size=128)
    dropped = []
    for index in range(8):
        turn = say(session, f"message number {index}")
        dropped.append(turn.dropped)
        assert len(turn.prompt) + session.reserve() <= session.capacity
        assert_consistent(session)
    assert sum(dropped) > 0 and dropped[0] == 0
    assert [e.user for e in session.conversation.exchanges][-1] == "message number 7"
    assert len(session.conversation.exchanges) == 8 - sum(dropped)
    assert session.conversation.messages()[0] == {"role": "system", "content": "Be kind."}
    # After dropping, the prompt is the rendering of what is left.
    assert session.context_used() <= session.capacity


def test_a_message_longer_than_the_context_is_refused_and_nothing_changes():
    session = Session(chat_model(max_seq_len=128), GREEDY, context_size=128)
    say(session, "hi")
    before = (list(session.transcript.ids), list(session.cache.tokens))
    with pytest.raises(ContextOverflowError, match="more than the context of 128 tokens"):
        session.send("x" * 200)
    assert (session.transcript.ids, session.cache.tokens) == before
    assert [e.user for e in session.conversation.exchanges] == ["hi"]


def test_retry_regenerates_from_the_truncated_cache():
    model = chat_model()
    session = Session(model, GREEDY)
    say(session, "one")
    original = say(session, "two")
    cached_before_reply = len(original.prompt)
    retried = session.retry()
    retried.run()
    assert retried.prompt == original.prompt
    assert retried.stats.reused_tokens == cached_before_reply - 1  # the generation prompt's last token is fed again
    assert retried.generation.tokens == original.generation.tokens  # greedy: the same reply
    assert [e.user for e in session.conversation.exchanges] == ["one", "two"]
    assert_consistent(session)


def test_undo_clear_and_system_keep_ids_and_cache_consistent():
    model = chat_model()
    session = Session(model, GREEDY, system="Be brief.")
    say(session, "one")
    say(session, "two")
    assert session.undo().user == "two"
    assert_consistent(session)
    assert session.transcript.ids == replay(model, ["one"], system="Be brief.").transcript.ids
    session.clear()
    assert session.conversation.exchanges == [] and session.conversation.system == "Be brief."
    assert session.transcript.ids == model.chat_format.encode([{"role": "system", "content": "Be brief."}], False)
    assert_consistent(session)
    with pytest.raises(LlamaChatError, match="nothing to undo"):
        session.undo()
    with pytest.raises(LlamaChatError, match="nothing to retry"):
        session.retry()


def test_changing_the_system_prompt_rebuilds_the_ids():
    model = chat_model()
    session = Session(model, GREEDY)
    say(session, "one")
    session.set_system("Answer in French.")
    expected = model.chat_format.encode(session.conversation.messages(), False)
    assert session.transcript.ids == expected  # replies re-tokenised: byte tokens stand for themselves...
    turn = say(session, "two")
    assert turn.prompt[: len(expected)] == expected


def test_save_then_open_restores_the_conversation_exactly(tmp_path):
    model = chat_model()
    settings = SamplingSettings(temperature=0, top_k=7, max_tokens=6, seed=5)
    session = Session(model, settings, system="Be brief.", model_path=tmp_path / "model.gguf")
    say(session, "one")
    say(session, "two <|im_end|> [bold]")
    path, _ = session.save(tmp_path / "chat.json")

    opened = Session(model, SamplingSettings(), model_path=tmp_path / "model.gguf")
    assert opened.open(path) is None
    assert opened.conversation.messages() == session.conversation.messages()
    assert opened.settings == settings
    assert opened.transcript.ids == session.transcript.ids
    assert [e.interrupted for e in opened.conversation.exchanges] == [False, False]
    assert say(opened, "three").generation.tokens == say(session, "three").generation.tokens


def test_open_of_another_models_file_says_so_and_rebuilds_the_ids(tmp_path):
    session = Session(chat_model(), GREEDY, model_path=tmp_path / "a.gguf")
    say(session, "one")
    session.save(tmp_path / "chat.json")
    other = Session(chat_model(seed=1), GREEDY, model_path=tmp_path / "b.gguf")
    note = other.open(tmp_path / "chat.json")
    assert "a.gguf" in note and "rebuilt" in note
    assert other.conversation.messages() == session.conversation.messages()
    assert other.transcript.ids == other.model.chat_format.encode(other.conversation.messages(), False)


def test_open_of_another_models_system_prompt_encodes_it_for_this_model(tmp_path):
    session = Session(chat_model("chatml"), GREEDY, system="Be brief.", model_path=tmp_path / "a.gguf")
    session.save(tmp_path / "chat.json")
    other = Session(chat_model("llama3"), GREEDY, model_path=tmp_path / "b.gguf")
    assert "rebuilt" in other.open(tmp_path / "chat.json")
    assert other.transcript.ids == other.model.chat_format.encode(other.conversation.messages(), False)


@pytest.mark.parametrize("contents, message", [
    ("not json", "bad JSON on line 1"),
    ('{"kind": "something else"}', "not a llama-chat conversation"),
    ('{"kind": "llama-chat conversation", "version": 1, "settings": {}, '
     '"messages": [{"role": "assistant", "content": "x"}]}', "alternate user, assistant"),
    ('{"kind": "llama-chat conversation", "version": 1, "settings": {"temperature": -1}, "messages": []}',
     "temperature must be"),
    ('{"kind": "llama-chat conversation", "version": 1, "settings": {"max_tokens": 5.5}, "messages": []}',
     "max_tokens must be a whole number"),
])
def test_bad_conversation_files_are_refused_and_nothing_changes(tmp_path, contents, message):
    session = Session(chat_model(), GREEDY)
    say(session, "one")
    before = session.conversation.messages()
    (tmp_path / "bad.json").write_text(contents)
    with pytest.raises(LlamaChatError, match=message):
        session.open(tmp_path / "bad.json")
    assert session.conversation.messages() == before and session.settings == GREEDY


def test_saved_file_is_readable_json(tmp_path):
    session = Session(chat_model(), GREEDY, system="S")
    say(session, "one")
    data = json.loads(session.save(tmp_path / "chat.json")[0].read_text())
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant"]
    assert data["settings"]["temperature"] == 0
    assert data["model"]["chat_format"] == "chatml"


def test_switching_models_keeps_the_conversation():
    session = Session(chat_model(), GREEDY)
    say(session, "one")
    other = chat_model(seed=3, max_seq_len=256, name="other")
    session.set_model(other, "other.gguf")
    assert session.model is other and session.capacity == 256
    assert [e.user for e in session.conversation.exchanges] == ["one"]
    turn = say(session, "two")
    assert turn.stats.reused_tokens == 0 and len(session.conversation.exchanges) == 2


def restored_session(model, path, model_path):
    opened = Session(model, GREEDY, model_path=model_path)
    return opened, opened.open(path)


def test_a_saved_cache_is_restored_and_continues_as_reading_the_conversation_again(tmp_path):
    model = chat_model()
    session = Session(model, GREEDY, system="Be brief.", model_path=tmp_path / "model.gguf")
    say(session, "one")
    say(session, "two")
    path, cached = session.save(tmp_path / "chat.json")
    assert cached == len(session.cache) > 10 and (tmp_path / "chat.kv.safetensors").exists()
    opened, note = restored_session(model, path, tmp_path / "model.gguf")
    assert note is None and opened.cache.tokens == session.cache.tokens
    assert torch.equal(opened.cache.state(cached)["keys"], session.cache.state(cached)["keys"])
    turn = say(opened, "three")
    assert turn.stats.reused_tokens == cached  # nothing read again
    reread = replay(model, ["one", "two", "three"], system="Be brief.")
    reread_reply = reread.transcript.spans.get(reread.conversation.exchanges[-1]).reply
    assert turn.generation.tokens == reread_reply[: len(turn.generation.tokens)]
    # The cache takes about its own size on disk: keys and values of the held positions.
    args = model.args
    own_size = 2 * args.n_layers * args.n_kv_heads * args.head_dim * 4 * cached
    assert own_size < (tmp_path / "chat.kv.safetensors").stat().st_size < own_size + 8 * cached + 4096


def test_a_cache_file_that_holds_the_same_positions_is_not_written_again(tmp_path):
    """Saving again with nothing new (the chat keeps its conversation after every command)
    leaves the cache file alone; a new turn, or the same positions in another dtype, write it
    anew."""
    session = Session(chat_model(), GREEDY, model_path=tmp_path / "model.gguf")
    say(session, "one")
    cache_file = tmp_path / "chat.kv.safetensors"
    session.save(tmp_path / "chat.json")
    written = cache_file.stat().st_ino
    session.apply_settings({"temperature": 0.5}, "set in the chat")
    assert session.save(tmp_path / "chat.json")[1] == len(session.cache)
    assert cache_file.stat().st_ino == written  # the same file: not replaced
    say(session, "two")
    session.save(tmp_path / "chat.json")
    assert cache_file.stat().st_ino != written
    written = cache_file.stat().st_ino
    state = session.cache.state()
    session.cache = KVCache(session.model.args, session.cache.capacity, dtype=torch.float16)
    session.cache.load_state(state["tokens"].tolist(), state)
    session.save(tmp_path / "chat.json")
    assert cache_file.stat().st_ino != written
    _, note = restored_session(chat_model(), tmp_path / "chat.json", tmp_path / "model.gguf")
    assert "holds a torch.float16 cache" in note  # the file holds what was saved last


@pytest.mark.parametrize("damage, reason", [
    ("truncate", "does not read back"),
    ("garbage", "does not read back"),
    ("other system prompt", "made with another system prompt"),
    ("other shapes", "other shapes"),
    ("other tokens", "other tokens than the conversation"),
    ("a directory", "does not read back"),
])
def test_a_cache_that_does_not_fit_is_refused_in_one_line_and_the_text_kept(tmp_path, damage, reason):
    from safetensors.torch import load_file, save_file

    model = chat_model()
    session = Session(model, GREEDY, system="Be brief.", model_path=tmp_path / "model.gguf")
    say(session, "one")
    path, _ = session.save(tmp_path / "chat.json")
    cache_file = tmp_path / "chat.kv.safetensors"
    if damage == "truncate":
        cache_file.write_bytes(cache_file.read_bytes()[:-100])
    elif damage == "garbage":
        cache_file.write_bytes(b"\0" * 64)
    elif damage == "other system prompt":
        session.set_system("Be long.")
        session.save(tmp_path / "other.json")
        (tmp_path / "other.kv.safetensors").replace(cache_file)
    elif damage in ("other shapes", "other tokens"):
        from safetensors import safe_open

        with safe_open(str(cache_file), framework="pt") as saved:
            metadata = saved.metadata()
        tensors = load_file(cache_file)
        if damage == "other shapes":
            tensors["keys"] = tensors["keys"][:, :1].contiguous()
        else:
            tensors["tokens"] = tensors["tokens"] + 1
        save_file(tensors, cache_file, metadata=metadata)
    else:
        cache_file.unlink()
        cache_file.mkdir()
    opened, note = restored_session(model, path, tmp_path / "model.gguf")
    assert note.startswith("its saved cache was not used (") and reason in note and "\n" not in note
    assert [e.user for e in opened.conversation.exchanges] == ["one"] and len(opened.cache) == 0
    assert say(opened, "two").stats.reused_tokens == 0  # read again


def test_a_narrower_cache_dtype_is_kept_and_saved_in_it(tmp_path):
    """--kv-dtype bfloat16: the cache holds bfloat16, replies stay close to float32's, and a
    saved bfloat16 cache is refused by a float32 one (named), the text kept."""
    wide = chat_model()
    narrow = Llama(wide.transformer, wide.tokenizer, name="tiny", chat_format=wide.chat_format,
                   cache_dtype=torch.bfloat16)
    session = Session(narrow, GREEDY, model_path=tmp_path / "model.gguf")
    assert session.cache.dtype == torch.bfloat16
    prompt = session.model.chat_format.encode([{"role": "user", "content": "hello there"}])
    cache = narrow.new_cache(64)
    narrow.runner(cache, prompt[:-1])  # every earlier position read back from bfloat16
    narrow_logits = narrow.runner(cache, prompt[-1:])
    assert torch.allclose(narrow_logits, wide.logits(prompt)[-1], atol=0.05)
    say(session, "one")
    path, cached = session.save(tmp_path / "chat.json")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "chat.kv.safetensors"), framework="pt") as saved:
        assert saved.get_tensor("keys").dtype == torch.bfloat16 and cached > 0
    opened, note = restored_session(wide, path, tmp_path / "model.gguf")
    assert "its saved cache was not used" in note and [e.user for e in opened.conversation.exchanges] == ["one"]


def test_a_float32_cache_file_restores_into_a_float16_cache_rounded_as_a_step_writes(tmp_path):
    """A conversation saved while caches were float32 (the earlier default) resumes under a
    float16 cache: its keys and values rounded to float16, as if computed in it."""
    wide = chat_model()
    session = Session(wide, GREEDY, model_path=tmp_path / "model.gguf")
    say(session, "one")
    path, cached = session.save(tmp_path / "chat.json")
    narrow = Llama(wide.transformer, wide.tokenizer, name="tiny", chat_format=wide.chat_format,
                   cache_dtype=torch.float16)
    opened, note = restored_session(narrow, path, tmp_path / "model.gguf")
    assert note is None and len(opened.cache) == cached > 0
    assert opened.cache.dtype == torch.float16
    restored, saved = opened.cache.state(cached), session.cache.state(cached)
    assert torch.equal(restored["keys"], saved["keys"].half())
    assert torch.equal(restored["values"], saved["values"].half())
    assert say(opened, "two").stats.reused_tokens == cached
