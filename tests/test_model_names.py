"""Model names (models/names.py) and the files a Hub listing is narrowed to (models/hub_files.py)."""

import pytest

from llama_chat.errors import LlamaChatError, UsageError
from llama_chat.models.cards import card_sampling
from llama_chat.models.hub_files import RepoFile, bits_per_weight, checked_listing, choose, quant_of
from llama_chat.models.names import HubName, ShortName, StoreName, parse_name

SHA = "a" * 64


@pytest.mark.parametrize("text, expected", [
    ("bartowski/Llama-3.2-3B-Instruct-GGUF", HubName("bartowski/Llama-3.2-3B-Instruct-GGUF")),
    ("hf:bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M", HubName("bartowski/Llama-3.2-3B-Instruct-GGUF", "Q4_K_M")),
    ("owner/repo:q8_0", HubName("owner/repo", "q8_0")),
    ("owner/repo/sub/model.Q8_0.gguf", HubName("owner/repo", file="sub/model.Q8_0.gguf")),
    ("owner/repo@v1.0", HubName("owner/repo", revision="v1.0")),
    ("owner/repo:Q4_0@refs/pr/3", HubName("owner/repo", "Q4_0", revision="refs/pr/3")),
    ("owner/repo@" + "0" * 40 + ":Q4_0", HubName("owner/repo", "Q4_0", revision="0" * 40)),
    ("ollama:llama3.2:3b", StoreName("ollama", "llama3.2:3b")),
    ("lmstudio:lmstudio-community/Qwen3-GGUF", StoreName("lmstudio", "lmstudio-community/Qwen3-GGUF")),
    ("llama3.2:3b", ShortName("llama3.2:3b")),
    ("smollm2-135m", ShortName("smollm2-135m")),
])
def test_names_parse_into_what_they_ask_for(text, expected):
    assert parse_name(text) == expected


@pytest.mark.parametrize("text", [
    "owner/../etc", "owner/repo/../../x.gguf", "owner/repo/a\x1b[2J.gguf", "-owner/repo", "owner/re--po",
    "owner/repo:Q4 K", "owner/repo@..", "owner/repo/file.gguf:Q4_0", "hf:owner", "ollama:", " ",
])
def test_malformed_names_are_one_usage_line(text):
    with pytest.raises(UsageError) as caught:
        parse_name(text)
    assert "\n" not in str(caught.value)


def test_a_hub_name_prints_as_it_is_written():
    assert str(parse_name("owner/repo:Q4_0@dev")) == "owner/repo:Q4_0@dev"


def ggufs(*names, size=100):
    return [RepoFile(name, size, SHA) for name in names]


QUANTS = ["Model-Q2_K.gguf", "Model-Q3_K_M.gguf", "Model-Q4_K_M.gguf", "Model-Q5_K_M.gguf", "Model-Q8_0.gguf",
          "README.md", "mmproj-Model-F16.gguf"]


def test_q4_k_m_is_taken_when_no_quantisation_is_named():
    choice = choose(ggufs(*QUANTS), parse_name("o/r"))
    assert [file.path for file in choice.files] == ["Model-Q4_K_M.gguf"] and choice.note is None


def test_a_named_quantisation_matches_without_case():
    assert choose(ggufs(*QUANTS), parse_name("o/r:q8_0")).entry == "Model-Q8_0.gguf"


def test_without_q4_k_m_the_nearest_above_four_bits_is_taken_and_said():
    choice = choose(ggufs("m-Q2_K.gguf", "m-Q3_K_M.gguf", "m-Q6_K.gguf", "m-Q5_K_M.gguf", "m-Q8_0.gguf"),
                    parse_name("o/r"))
    assert choice.entry == "m-Q5_K_M.gguf"
    assert "Q5_K_M" in choice.note and "Q4_K_M" in choice.note


def test_a_quantisation_not_offered_lists_those_that_are():
    with pytest.raises(LlamaChatError, match="offers no IQ2_XS.*Q2_K, Q3_K_M, Q4_K_M, Q5_K_M, Q8_0"):
        choose(ggufs(*QUANTS), parse_name("o/r:IQ2_XS"))


def test_a_split_file_brings_every_part_in_order():
    files = ggufs("Q8_0/m-Q8_0-00002-of-00003.gguf", "Q8_0/m-Q8_0-00001-of-00003.gguf",
                  "Q8_0/m-Q8_0-00003-of-00003.gguf", "m-Q4_0.gguf")
    choice = choose(files, parse_name("o/r:Q8_0"))
    assert [file.path for file in choice.files] == [f"Q8_0/m-Q8_0-0000{n}-of-00003.gguf" for n in (1, 2, 3)]
    assert choice.entry == "Q8_0/m-Q8_0-00001-of-00003.gguf"


def test_a_split_file_missing_a_part_is_refused():
    with pytest.raises(LlamaChatError, match="part 2 is not in the repository"):
        choose(ggufs("m-Q8_0-00001-of-00002.gguf"), parse_name("o/r:Q8_0"))


def test_a_safetensors_repo_fetches_config_tokenizer_and_shards_only():
    files = [RepoFile(name, 10) for name in (
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "README.md",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
        "pytorch_model.bin", "onnx/model.onnx", "onnx/config.json", "original/consolidated.00.pth")]
    choice = choose(files, parse_name("o/r"))
    assert {file.path for file in choice.files} == {
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"}
    assert choice.entry == "config.json"


def test_a_repo_of_bin_weights_only_is_refused():
    with pytest.raises(LlamaChatError, match="no .safetensors weights"):
        choose([RepoFile("config.json", 1), RepoFile("pytorch_model.bin", 1)], parse_name("o/r"))


@pytest.mark.parametrize("path", ["../evil.gguf", "/etc/evil.gguf", "a/../../evil.gguf", "a\x00b.gguf",
                                  "evil\n.gguf", "C:/evil.gguf", "a\\..\\evil.gguf", "./x.gguf",
                                  "txt.\u202eevil.gguf", "a\x85b.gguf", "zero\u200bwidth.gguf"])
def test_a_hostile_name_in_a_listing_is_refused(path):
    with pytest.raises(LlamaChatError, match="refused the file name"):
        checked_listing([RepoFile("ok.gguf", 1), RepoFile(path, 1)], "o/r")


def test_a_listing_longer_than_a_repository_holds_is_refused():
    with pytest.raises(LlamaChatError, match="more than a model repository holds"):
        checked_listing([RepoFile(f"f{n}.gguf", 1) for n in range(20_001)], "o/r")


def test_a_malformed_sha256_in_a_listing_is_refused():
    with pytest.raises(LlamaChatError, match="malformed sha256"):
        checked_listing([RepoFile("m.gguf", 1, "../../x")], "o/r")


def test_quantisations_in_file_names_and_their_order():
    assert quant_of("Llama-3.2-1B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("model.q8_0.gguf") == "Q8_0"
    assert quant_of("IQ4_XS/model-IQ4_XS-00001-of-00002.gguf") == "IQ4_XS"
    assert quant_of("model.gguf") is None
    order = ["IQ2_XS", "Q2_K", "Q3_K_M", "IQ4_XS", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16"]
    assert sorted(order, key=bits_per_weight) == order


def test_the_default_models_card_recommends_its_sampling_to_chat_models_only():
    assert card_sampling(["SmolLM2-135M-Instruct.Q4_1.gguf"], chats=True) == {"temperature": 0.2, "top_p": 0.9}
    assert card_sampling(["smollm2"], chats=False) == {}
    assert card_sampling(["Llama-3.2-1B"], chats=True) == {}


def test_the_models_table_prints_a_strangers_names_literally():
    from llama_chat.models.catalog import Catalog, Row
    from llama_chat.repl.model_commands import table_lines

    row = Row("lmstudio:pub/\u202eevil/m.gguf", "lmstudio", "llama", 135_000_000, "Q4_0", 2_000_000,
              "/models/pub/\x1b]0;title\x07/m.gguf", "built-in (llama)")
    text = "\n".join(table_lines(Catalog([row], [])))
    assert "\u202e" not in text and "\x1b" not in text and "\x07" not in text
    assert "lmstudio:pub/\\u202eevil/m.gguf" in text and "/models/pub/\\x1b]0;title\\x07/m.gguf" in text
    assert "135 M" in text and "2.0 MB" in text
