"""Llama's descendants as switches on its blocks: Qwen2 (q, k and v biases), Qwen3 (q and k
normed per head, a head width that is not dim / heads), Granite (multipliers on the
embedding, the residuals, the attention scores and the logits) and Phi-3 (fused tensors in
the file, rotation of part of each head, longrope scaling), from Hugging Face folders and
GGUF files, against transformers' own classes."""

import json
import math

import pytest
import torch
from gguf import GGMLQuantizationType as QType
from tokenizers import Regex, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import llama_chat
from llama_chat.chat.session import Session
from llama_chat.checkpoints.gguf import load_gguf
from llama_chat.checkpoints.hf import args_from_hf_config, load_hf_directory
from llama_chat.disk_cache import entry_path
from llama_chat.engine import compiled
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.engine.speculation import Speculation
from llama_chat.errors import LlamaChatError
from llama_chat.model_info import model_info
from llama_chat.options import DraftLength
from llama_chat.parallel.sharding import Shard, is_sharded, shard_state
from llama_chat.text.gguf_tokenizer import pre_tokenizer_for

from .hf_reference import hf_logits, llama_from_checkpoint
from .test_gguf import VOCAB as GGUF_VOCAB
from .test_gguf import write_gguf
from .test_hf_checkpoint import BOS, EOT, MULTILINGUAL, VOCAB, write_json, write_tokenizer_json
from .test_hf_tokenizer import byte_level_metadata
from .test_runners import compiled_runner
from .test_session import GREEDY, restored_session, say

IDS = [BOS] + [(37 * i) % 290 + 5 for i in range(63)]
SHAPES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=BOS,
              eos_token_id=EOT)
KINDS = {
    "qwen2": lambda **shapes: Qwen2ForCausalLM(Qwen2Config(**shapes, use_sliding_window=False)),
    "qwen3": lambda **shapes: Qwen3ForCausalLM(Qwen3Config(**shapes, head_dim=32)),
    "granite": lambda **shapes: GraniteForCausalLM(GraniteConfig(
        **shapes, embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.0)),
    # Phi-4-mini's partial rotation (3/4 of each head) and Phi-3's longrope, with an original
    # context of 48: the 64 tokens of IDS take the long factors.
    "phi3": lambda **shapes: Phi3ForCausalLM(Phi3Config(
        **shapes, partial_rotary_factor=0.75, sliding_window=None, pad_token_id=None,
        original_max_position_embeddings=48,
        rope_scaling={"rope_type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG})),
}
PHI3_SHORT, PHI3_LONG = [1.0 + 0.1 * i for i in range(6)], [2.0 + 0.3 * i for i in range(6)]
GRANITE_SCALES = {"embedding_scale": 4.0, "residual_scale": 0.5, "attention_scale": 0.2, "logit_scale": 2.0}


def granite_keys(writer) -> None:
    """Granite's multipliers as llama.cpp's converter writes them."""
    writer.add_embedding_scale(4.0)
    writer.add_residual_scale(0.5)
    writer.add_attention_scale(0.2)
    writer.add_logit_scale(2.0)


def descendant(kind: str, tied: bool = False, seed: int = 5, **shapes):
    """A random model of transformers' class for `kind`, at a scale that gives lively logits."""
    model = KINDS[kind](**{**SHAPES, **shapes}, tie_word_embeddings=tied).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith("bias"):
                parameter.copy_(0.5 * noise)
            elif parameter.ndim == 1:
                parameter.copy_(1.0 + 0.1 * noise)
            else:
                parameter.copy_(noise / math.sqrt(parameter.shape[1]))
    return model


def save_descendant(directory, kind: str, tied: bool = False, seed: int = 5):
    """descendant(kind), saved with a tokenizer as a Hugging Face folder."""
    model = descendant(kind, tied, seed)
    model.save_pretrained(directory)
    write_tokenizer_json(directory)
    write_json(directory / "tokenizer_config.json", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    return model


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "granite", "phi3"])
def test_a_descendants_folder_gives_transformers_logits_exactly(tmp_path, kind, tied):
    model = save_descendant(tmp_path, kind, tied)
    checkpoint = load_hf_directory(tmp_path)
    args = checkpoint.args
    assert (args.qkv_bias, args.qk_norm, args.tie_embeddings) == (kind == "qwen2", kind == "qwen3", tied)
    assert args.head_dim == (32 if kind == "qwen3" else 16)  # Qwen3's is not dim / heads
    assert args.architecture == kind and args.rotary_dim == (12 if kind == "phi3" else args.head_dim)
    assert args.rope_scaling.kind == ("longrope" if kind == "phi3" else "none")
    scales = {name: getattr(args, name) for name in GRANITE_SCALES}
    assert scales == (GRANITE_SCALES if kind == "granite" else
                      {"embedding_scale": 1.0, "residual_scale": 1.0, "attention_scale": None, "logit_scale": 1.0})
    ours = llama_from_checkpoint(checkpoint).logits(IDS)
    torch.testing.assert_close(ours, hf_logits(model, IDS), atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "granite", "phi3"])
def test_a_descendant_packed_for_the_cpu_chooses_as_the_exact_path_does(tmp_path, kind):
    """The default load (packed weights, on llama-chat's kernels where they run, through the
    cache a token at a time and as a prompt) against float32 transformers, teacher-forced."""
    model = save_descendant(tmp_path, kind)
    reference = hf_logits(model, IDS)
    packed = llama_chat.load(tmp_path, device="cpu")
    assert packed.weights.packed
    cache = packed.new_cache(80)
    prompt = packed.runner(cache, IDS[:16], every_logits=True)
    singles = torch.stack([packed.runner(cache, [token]) for token in IDS[16:]])
    logits = torch.cat([prompt, singles])
    # Measured: the Q8_0 weights move logits (up to about 4) by at most 0.07 (Qwen2), 0.09
    # (Qwen3) and 0.15 (Phi-3; single tokens' 16-bit activations add 0.001 of that), as they
    # move a Llama of these shapes (0.14); a random model's near ties can flip, so the choice
    # is asserted where transformers' two best are 0.2 apart (a quarter to a half).
    assert (logits - reference).abs().max() < 0.16
    best, second = torch.topk(reference, 2).values.unbind(-1)
    clear = best - second > 0.2
    assert clear.sum() >= 16 and torch.equal(logits.argmax(-1)[clear], reference.argmax(-1)[clear])


PHI3_CONFIG = dict(model_type="phi3", hidden_size=64, num_attention_heads=4, num_hidden_layers=2, vocab_size=300,
                  intermediate_size=96, max_position_embeddings=128)


@pytest.mark.parametrize("extra, message", [
    ({"partial_rotary_factor": 1e308}, "partial_rotary_factor is 1e+308; a share of each head from 0 to 1"),
    ({"partial_rotary_factor": 0.1}, "the rotary width must be an even number from 2 to head_dim 16, got 1"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1] * 8, "long_factor": [1] * 7}},
     "longrope needs 8 short and long factors (one per turning pair), got 8 and 7"),
    ({"rope_scaling": {"type": "longrope", "short_factor": "1", "long_factor": [1] * 8}},
     "rope_scaling's short_factor is '1', where a list of numbers belongs"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1] * 8, "long_factor": [0] * 8}},
     "long_factors must all be positive numbers"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1] * 8, "long_factor": [1] * 8,
                       "original_max_position_embeddings": 1}},
     "original_max_position_embeddings is 1; a context of 2 tokens or more belongs"),
])
def test_a_phi3_config_out_of_range_is_one_line(extra, message):
    with pytest.raises(LlamaChatError) as refused:
        args_from_hf_config({**PHI3_CONFIG, **extra})
    assert message in str(refused.value) and "\n" not in str(refused.value)


def trained_descendant(directory, kind: str):
    """descendant(kind) trained until it recites IDS (a few hundred Adam steps on one sequence,
    a second or two), saved as a Hugging Face folder: logits as peaked as a trained model's."""
    model = descendant(kind)
    loss = train_to_recite(model, IDS)
    model.save_pretrained(directory)
    write_tokenizer_json(directory)
    write_json(directory / "tokenizer_config.json", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    return model, loss


def train_to_recite(model, ids: list[int], steps: int = 300) -> float:
    """A few hundred Adam steps on one sequence (a second or two): logits as peaked as a
    trained model's. Returns the last loss."""
    tokens = torch.tensor([ids])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
    model.eval()
    return loss.item()


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "granite", "phi3"])
def test_a_trained_descendant_packed_agrees_with_the_exact_path_on_top_1(tmp_path, kind):
    """Teacher-forced over the text the model learned, the packed path's top token is the exact
    path's at 98% of positions or more (a random model's near ties say little about this)."""
    _, loss = trained_descendant(tmp_path, kind)
    assert loss < 0.5  # it has learned the text
    exact = llama_chat.load(tmp_path, device="cpu", quantize="none")
    packed = llama_chat.load(tmp_path, device="cpu")
    assert not exact.weights.packed and packed.weights.packed
    chosen = {}
    for name, model in (("exact", exact), ("packed", packed)):
        cache = model.new_cache(80)
        prompt = model.runner(cache, IDS[:16], every_logits=True)
        chosen[name] = torch.cat([prompt, torch.stack([model.runner(cache, [t]) for t in IDS[16:]])]).argmax(-1)
    agreement = (chosen["exact"] == chosen["packed"]).float().mean()
    assert agreement >= 0.98, agreement


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "granite", "phi3"])
def test_a_descendant_speculates_and_resumes_as_llama_does(tmp_path, kind):
    """Packed, from its folder, and again from the packed cache: prompt-lookup drafts leave the
    greedy reply as it was, and a conversation saved with its cache and opened again
    continues as the unbroken one."""
    save_descendant(tmp_path / "model", kind)
    model = packed_and_mapped_again(tmp_path / "model")
    assert_drafts_keep_the_greedy_reply(model, IDS[:20] * 2, 24)
    assert_a_saved_conversation_resumes(model, tmp_path, ["one"])


def packed_and_mapped_again(folder):
    """The model at `folder` packed into the packed cache, then loaded again from it: the
    second load, whose logits must be the first's."""
    first = llama_chat.load(folder, device="cpu")
    assert any(entry_path("packed").iterdir())
    model = llama_chat.load(folder, device="cpu")  # mapped from the packed cache
    assert torch.equal(model.logits(IDS[:12]), first.logits(IDS[:12]))
    return model


def assert_drafts_keep_the_greedy_reply(model, prompt: list[int], max_tokens: int) -> None:
    """Prompt-lookup drafts (some drafted) leave the greedy reply as it is without them."""
    greedy = SamplingSettings(temperature=0, max_tokens=max_tokens)
    replies = []
    for speculation in (None, Speculation(lookup=DraftLength(4))):
        generation = model.generate(prompt, greedy, stop_ids=(), speculation=speculation)
        list(generation)
        replies.append(generation)
    assert replies[1].tokens == replies[0].tokens and replies[1].stats.drafted_tokens > 0


def assert_a_saved_conversation_resumes(model, folder, messages: list[str]):
    """A conversation of `messages`, saved with its cache and opened again, continues as the
    unbroken one, its whole cache reused. Returns the session."""
    session = Session(model, GREEDY, model_path=folder / "model")
    for message in messages:
        say(session, message)
    path, cached = session.save(folder / "chat.json")
    opened, note = restored_session(model, path, folder / "model")
    assert note is None and cached > 0 and opened.cache.tokens == session.cache.tokens
    resumed = say(opened, "two")
    assert resumed.stats.reused_tokens == cached
    assert resumed.generation.tokens == say(session, "two").generation.tokens
    return session


def test_a_saved_phi3_cache_is_used_only_under_the_factors_it_was_turned_with(tmp_path):
    save_descendant(tmp_path / "model", "phi3")
    model = llama_chat.load(tmp_path / "model", device="cpu")
    session = Session(model, GREEDY, model_path=tmp_path / "model", context_size=40)  # short factors
    say(session, "one")
    path, cached = session.save(tmp_path / "chat.json")
    same = Session(model, GREEDY, model_path=tmp_path / "model", context_size=40)
    assert same.open(path) is None and len(same.cache) == cached > 0
    longer = Session(model, GREEDY, model_path=tmp_path / "model", context_size=80)  # beyond 48: long factors
    note = longer.open(path)
    assert "its saved cache was not used" in note and len(longer.cache) == 0


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "granite", "phi3"])
def test_a_descendant_resaved_by_convert_reads_back_the_same(tmp_path, kind):
    from llama_chat.checkpoints.hf_writer import write_hf_directory

    model = save_descendant(tmp_path / kind, kind)
    checkpoint = load_hf_directory(tmp_path / kind)
    write_hf_directory(checkpoint, tmp_path / "again", torch.float32)
    config = json.loads((tmp_path / "again" / "config.json").read_text())
    assert config["model_type"] == kind
    again = load_hf_directory(tmp_path / "again")
    torch.testing.assert_close(llama_from_checkpoint(again).logits(IDS), llama_from_checkpoint(checkpoint).logits(IDS))
    # transformers reads the folder as the model it came from (Phi-3's fused tensors and rotary order put back).
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "again", dtype=torch.float32).eval()
    torch.testing.assert_close(hf_logits(theirs, IDS), hf_logits(model, IDS), atol=1e-5, rtol=0)


def test_phi3_turns_with_the_factors_of_the_context_it_runs_in(tmp_path):
    """Longrope: a cache within the original context (48) turns with the short factors, as
    transformers does a sequence that short; a longer cache with the long ones; a whole
    sequence by its own length, whatever the last cache chose."""
    model = save_descendant(tmp_path, "phi3")
    ours = llama_from_checkpoint(load_hf_directory(tmp_path))
    short_ids = IDS[:40]
    for capacity, ids in ((48, short_ids), (80, IDS), (40, short_ids)):
        cache = ours.new_cache(capacity)
        logits = torch.cat([ours.runner(cache, ids[:10], every_logits=True),
                            torch.stack([ours.runner(cache, [token]) for token in ids[10:]])])
        torch.testing.assert_close(logits, hf_logits(model, ids), atol=1e-4, rtol=0)
        ours.new_cache(80)  # the long factors held: a whole short sequence still turns with the short ones
        torch.testing.assert_close(ours.logits(short_ids), hf_logits(model, short_ids), atol=1e-4, rtol=0)
    long_only = hf_logits(model, IDS)[:40]
    assert (long_only - hf_logits(model, short_ids)).abs().max() > 0.1  # the two sets of factors differ


def test_the_biases_split_between_ranks_with_their_heads(tmp_path):
    save_descendant(tmp_path, "qwen2")
    checkpoint = load_hf_directory(tmp_path)
    args = checkpoint.args
    whole = checkpoint.tensors["layers.0.attention.qkv_bias"]
    q, k, v = whole.split([4 * 16, 2 * 16, 2 * 16])  # each rank: 2 query heads and 1 key/value head
    halves = [shard_state(checkpoint.tensors, args, Shard(rank, 2))["layers.0.attention.qkv_bias"] for rank in (0, 1)]
    for rank, half in enumerate(halves):
        expected = torch.cat([q[rank * 32 : (rank + 1) * 32], k[rank * 16 : (rank + 1) * 16],
                              v[rank * 16 : (rank + 1) * 16]])
        assert torch.equal(half, expected)
    assert is_sharded("layers.0.attention.qkv_bias") and not is_sharded("layers.0.attention.q_norm.weight")


@pytest.mark.needs_compiler
@pytest.mark.parametrize("kind", ["qwen3", "phi3"])
def test_a_descendants_compiled_packages_agree_with_its_eager_calls(tmp_path, kind):
    """Qwen3's per-head norms, and Phi-3's long factors (chosen by the cache after the packages
    were built: they read the model's tables as they are), in the packages compiled ahead of
    time, single tokens and a verify-sized call, against the eager runner."""
    save_descendant(tmp_path, kind)
    compiled_logits, eager_logits = compiled_and_eager(llama_chat.load(tmp_path, device="cpu"), tmp_path, IDS[:40], 30)
    torch.testing.assert_close(compiled_logits, eager_logits, atol=1e-3, rtol=0)


def compiled_and_eager(model, folder, ids, singles: int, capacity: int = 80):
    """The model's logits through its packages compiled ahead of time (built into `folder`),
    and through eager calls, on a cache of `capacity`: a prompt of 20 tokens, then single
    tokens up to `singles`, then the rest of `ids` in one verify-sized call."""
    packages = built_packages(model, folder)
    return [logits_through(model, chosen, ids, singles, capacity) for chosen in (packages, None)]


def built_packages(model, folder):
    """The model's decode step compiled ahead of time into `folder`, as the chat builds it."""
    background = compiled.BackgroundBuild(model.transformer, model.cache_dtype, folder / "decode.pt2")
    background.wait()
    assert background.error == "" and background.packages is not None
    return background.packages


def logits_through(model, packages, ids, singles: int, capacity: int):
    """Logits of `ids` with the runner using `packages` (None: eager), as compiled_and_eager says."""
    compiled_runner(model).packages = packages
    cache = model.new_cache(capacity)
    model.runner(cache, ids[:20])
    return torch.cat([torch.stack([model.runner(cache, [token]) for token in ids[20:singles]]),
                      model.runner(cache, ids[singles:], every_logits=True)])


GGUF_IDS = [(37 * i) % 260 + 3 for i in range(64)]


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "granite", "phi3"])
def test_a_descendants_gguf_gives_transformers_logits(tmp_path, kind):
    """A GGUF file as llama.cpp's converter writes these architectures (their hyper-parameters
    under qwen2.* / qwen3.*, q and k rows not permuted, biases and per-head norms as tensors):
    F32 against transformers within 1e-4; Q8_0 packed, choosing alike where the choice is clear."""
    model = descendant(kind, vocab_size=len(GGUF_VOCAB))
    reference = hf_logits(model, GGUF_IDS)
    extra = granite_keys if kind == "granite" else None
    path = write_gguf(tmp_path / "f32.gguf", model, architecture=kind, vocabulary=byte_level_metadata(pre="qwen2"),
                      extra=extra)
    checkpoint = load_gguf(path)
    assert (checkpoint.args.qkv_bias, checkpoint.args.qk_norm) == (kind == "qwen2", kind == "qwen3")
    torch.testing.assert_close(llama_from_checkpoint(checkpoint).logits(GGUF_IDS), reference, atol=1e-4, rtol=0)
    path = write_gguf(tmp_path / "q8.gguf", model, qtype=QType.Q8_0, architecture=kind,
                      vocabulary=byte_level_metadata(pre="qwen2"), extra=extra)
    packed = llama_chat.load(path, device="cpu")
    assert packed.weights.packing == "Q8_0"
    logits = packed.runner(packed.new_cache(80), GGUF_IDS, every_logits=True)
    best, second = torch.topk(reference, 2).values.unbind(-1)
    clear = best - second > 0.2
    assert clear.sum() >= 16 and torch.equal(logits.argmax(-1)[clear], reference.argmax(-1)[clear])


# Phi-3 within its original context (48): the short factors. Every other Phi-3 check above
# runs a cache past it, on the long ones.
SHORT_IDS = GGUF_IDS[:40]


def phi3_file(directory, qtype: QType):
    """descendant("phi3") as a GGUF file of `qtype`, its factors as llama.cpp's converter writes them."""
    model = descendant("phi3", vocab_size=len(GGUF_VOCAB))
    path = write_gguf(directory / f"phi3-{qtype.name}.gguf", model, qtype=qtype, architecture="phi3",
                      vocabulary=byte_level_metadata(pre="qwen2"))
    return model, path


def short_and_long_references(model) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' logits of SHORT_IDS alone (short factors), and as the start of a sequence
    past the original context (long factors): far apart, so that a check can fail."""
    short, long = hf_logits(model, SHORT_IDS), hf_logits(model, GGUF_IDS)[: len(SHORT_IDS)]
    assert (short - long).abs().mean() > 0.3
    return short, long


def cached_logits(model, ids, capacity: int) -> torch.Tensor:
    """Logits of `ids` through a cache of `capacity`: a prompt of 10, then a token at a time."""
    cache = model.new_cache(capacity)
    return torch.cat([model.runner(cache, ids[:10], every_logits=True),
                      torch.stack([model.runner(cache, [token]) for token in ids[10:]])])


def assert_turns_as(logits, reference, other, least_clear: int = 16) -> None:
    """Packed logits that follow `reference` (rounding apart: measured, a mean of 0.025 and at
    most 0.17) and not `other`, choosing as it does where its two best are 0.2 apart (at
    `least_clear` positions or more)."""
    assert (logits - reference).abs().mean() < 0.05 and (logits - reference).abs().max() < 0.25
    assert (logits - other).abs().mean() > 0.3
    best, second = torch.topk(reference, 2).values.unbind(-1)
    clear = best - second > 0.2
    assert clear.sum() >= least_clear and torch.equal(logits.argmax(-1)[clear], reference.argmax(-1)[clear])


def test_phi3_from_a_gguf_turns_with_its_short_factors_within_its_original_context(tmp_path):
    """A cache of 40, and one of exactly the original context (48): F32 through the GGUF reader
    against transformers within 1e-4; Q8_0 packed, and mapped again from the packed cache."""
    model, f32 = phi3_file(tmp_path, QType.F32)
    short, long = short_and_long_references(model)
    exact = llama_from_checkpoint(load_gguf(f32))
    torch.testing.assert_close(cached_logits(exact, SHORT_IDS, 40), short, atol=1e-4, rtol=0)
    _, q8 = phi3_file(tmp_path, QType.Q8_0)
    for packed in (llama_chat.load(q8, device="cpu"), llama_chat.load(q8, device="cpu")):  # packed, then mapped
        assert packed.weights.packed
        assert_turns_as(cached_logits(packed, SHORT_IDS, 48), short, long)
        assert_turns_as(cached_logits(packed, SHORT_IDS, 80), long, short)  # past it, the long ones
        assert_turns_as(cached_logits(packed, SHORT_IDS, 48), short, long)  # and back
    assert any(entry_path("packed").iterdir())


@pytest.mark.needs_compiler
def test_phi3s_compiled_packages_turn_with_the_short_factors_after_the_long_ones(tmp_path):
    """The packages read the model's rotary tables as they are when called: a cache within
    the original context, made after one past it, turns the compiled calls with the short
    factors again."""
    model, q8 = phi3_file(tmp_path, QType.Q8_0)
    short, long = short_and_long_references(model)
    packed = llama_chat.load(q8, device="cpu")
    packages = built_packages(packed, tmp_path)
    for capacity, reference, other in ((80, long, short), (48, short, long)):
        compiled_logits = logits_through(packed, packages, SHORT_IDS, 30, capacity)
        eager_logits = logits_through(packed, None, SHORT_IDS, 30, capacity)
        torch.testing.assert_close(compiled_logits, eager_logits, atol=1e-3, rtol=0)
        assert_turns_as(compiled_logits, reference[20:], other[20:], least_clear=4)


# The split patterns of Qwen2's and Phi-4-mini's tokenizer.json, written out whole.
TOKENIZER_JSON_SPLITS = {
    "qwen2": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "gpt-4o": (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
}


@pytest.mark.parametrize("name", sorted(TOKENIZER_JSON_SPLITS))
def test_a_split_is_the_one_its_models_tokenizer_json_names(name):
    """`qwen2` (Qwen2's) and `gpt-4o` (tiktoken's o200k split, Phi-4-mini's) against a
    tokenizers pipeline built from that tokenizer.json's settings, on multilingual text."""
    reference = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TOKENIZER_JSON_SPLITS[name]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    ours = pre_tokenizer_for(name)
    for text in [*MULTILINGUAL, "HelloWorld I'M 12345 and 3.14159", "path\n/usr/bin x=1;y=22\r\n\r\nz"]:
        assert ours.pre_tokenize_str(text) == reference.pre_tokenize_str(text), text


def test_the_names_that_share_a_split_and_what_sets_o200k_apart():
    same = pre_tokenizer_for("qwen2").pre_tokenize_str("a 2024")
    assert pre_tokenizer_for("deepseek-r1-qwen").pre_tokenize_str("a 2024") == same
    assert [word for word, _ in same] == ["a", "Ġ", "2", "0", "2", "4"]  # every digit a word of its own
    assert [word for word, _ in pre_tokenizer_for("gpt-4o").pre_tokenize_str("HelloWorld 2024")] == [
        "Hello", "World", "Ġ", "202", "4"]


def test_info_names_the_architecture_of_a_folder_and_of_a_file(tmp_path):
    save_descendant(tmp_path / "phi3", "phi3")
    rows = dict(model_info(tmp_path / "phi3"))
    assert rows["architecture"] == "phi3" and rows["heads"] == "4 query, 2 key/value, 16 wide, 12 of them turning"
    model = descendant("qwen2", vocab_size=len(GGUF_VOCAB))
    path = write_gguf(tmp_path / "qwen2.gguf", model, architecture="qwen2", vocabulary=byte_level_metadata(pre="qwen2"))
    assert dict(model_info(path))["architecture"] == "qwen2"
