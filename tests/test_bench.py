import pytest

from llama_chat.cli import main
from llama_chat.cli.bench import (
    add_machine_limits,
    layer_matrices,
    measure_speculation,
    random_prompt,
    run,
    speculation_line,
)

from .test_session import chat_model


def test_bench_measures_a_model_and_says_how_it_ran(tiny_model):
    result = run(tiny_model, prompt_tokens=12, new_tokens=5, repeats=2)
    assert result["prefill_tokens_per_second"] > 0 and result["decode_tokens_per_second"] > 0
    assert 0 < result["time_to_first_token"] and 0 < result["chat_turn_first_token"]
    assert (result["device"], result["dtype"], result["quantization"]) == ("cpu", "float32", "none")
    assert (result["prompt_tokens"], result["new_tokens"], result["repeats"]) == (12, 5, 2)


def test_bench_rates_prefill_against_the_layers_matrices_and_the_largest_ones_rate(tiny_model):
    a = tiny_model.args
    per_layer = (a.dim * a.n_heads * a.head_dim + 2 * a.dim * a.n_kv_heads * a.head_dim  # q, k, v
                 + a.n_heads * a.head_dim * a.dim + 3 * a.dim * a.hidden_dim)  # output; gate, up, down
    multiply_adds = a.n_layers * per_layer
    assert sum(m.in_features * m.out_features for m in layer_matrices(tiny_model)) == multiply_adds
    result = {"prefill_tokens_per_second": 1000.0, "decode_tokens_per_second": 10.0}
    add_machine_limits(result, tiny_model)
    prefill_gflops = 1000.0 * 2 * multiply_adds / 1e9
    for rate, share in (("int8_gops", "prefill_share_of_int8_rate"), ("bfloat16_gflops", "prefill_share_of_bfloat16_rate"),
                        ("matrix_step_gflops", "prefill_share_of_matrix_rate")):
        assert result[rate] > 0 and result[share] == pytest.approx(prefill_gflops / result[rate]), rate


def test_the_benchmark_prompt_depends_only_on_vocabulary_and_length():
    prompt = random_prompt(300, 50)
    assert prompt == random_prompt(300, 50) and len(prompt) == 50
    assert all(0 <= token < 300 for token in prompt) and len(set(prompt)) > 30


@pytest.mark.parametrize("flag", ["--repeats", "--prompt-tokens", "--new-tokens", "--threads"])
def test_counts_below_one_are_refused_in_one_line(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", flag, "0"])
    assert exit_info.value.code == 2
    assert f"argument {flag}: must be positive, got 0" in capsys.readouterr().err


def test_bench_measures_speculation_and_checks_each_reply():
    model, draft = chat_model(seed=3), chat_model(seed=1)
    results = measure_speculation(model, "abc abc abc abc abc abc", 30, 1, draft)
    assert set(results) == {"without", "lookup", "draft"}
    assert all(run["same_reply"] and run["decode_tokens_per_second"] > 0 for run in results.values())
    assert results["without"]["drafted_tokens"] == 0  # (auto drafts where this machine's timings say it pays)
    line = speculation_line(results)
    assert line.startswith("without ") and "prompt lookup" in line and "draft model" in line
    assert "A DIFFERENT REPLY" not in line


def test_bench_and_the_chat_declare_the_same_model_flags(capsys):
    sections = []
    for argv in (["--help"], ["bench", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        text = capsys.readouterr().out
        sections.append(text[text.index("the model and how it is loaded:"):].split("\n\n")[0].rstrip())
    assert sections[0] == sections[1]
    assert all(flag in sections[0] for flag in ("--model", "--device", "--dtype", "--quantize", "--kv-dtype", "--tp"))


def test_bench_on_pytorchs_kernels_names_no_variant_and_no_exact_peak(tiny_model):
    result = {"prefill_tokens_per_second": 1000.0, "decode_tokens_per_second": 10.0}
    add_machine_limits(result, tiny_model)
    assert (result["kernel_variant"], result["exact_prompt_peak_gops"], result["prefill_share_of_exact_peak"]) == (
        None, None, None)
