"""Options typed where a program starts: the LLAMA_CHAT_* variables read and checked in
environment.py, the flags in cli/, the drafting length, and what a child process is given."""

import argparse
import os
import subprocess
import sys

import pytest
import torch

from llama_chat import environment, paths
from llama_chat.cli.arguments import add_model_arguments
from llama_chat.cli.options import load_options
from llama_chat.errors import LlamaChatError, UsageError
from llama_chat.models.hub import HubSettings
from llama_chat.options import DraftLength, KernelFamily, KernelOptions, LoadOptions


def test_the_variables_become_typed_kernel_options():
    options = environment.kernel_options({
        "LLAMA_CHAT_KERNELS": "ATEN", "LLAMA_CHAT_KERNEL_VARIANT": "avx2", "LLAMA_CHAT_ACTIVATION_BITS": "8",
        "LLAMA_CHAT_DTYPE": "bf16", "LLAMA_CHAT_KERNEL_DTYPE": "float32", "LLAMA_CHAT_KERNEL_ROWS": "12",
        "LLAMA_CHAT_PACKED_CACHE_GB": " 2.5 ",
    })
    assert options == KernelOptions(KernelFamily.ATEN, "avx2", 8, torch.bfloat16, torch.float32, 12, 2.5)
    assert environment.kernel_options({}) == KernelOptions()  # every one auto
    assert environment.kernel_options({"LLAMA_CHAT_KERNEL_VARIANT": ""}).variant == ""  # set, even empty, it forces


@pytest.mark.parametrize("variable, value, message", [
    ("LLAMA_CHAT_KERNELS", "mine", "LLAMA_CHAT_KERNELS='mine': use auto, ours or aten"),
    ("LLAMA_CHAT_ACTIVATION_BITS", "4", "LLAMA_CHAT_ACTIVATION_BITS='4': use 16 or 8"),
    ("LLAMA_CHAT_DTYPE", "float16", "LLAMA_CHAT_DTYPE='float16': use auto, bfloat16 or float32"),
    ("LLAMA_CHAT_KERNEL_DTYPE", "int8", "LLAMA_CHAT_KERNEL_DTYPE='int8': use auto, bfloat16 or float32"),
    ("LLAMA_CHAT_KERNEL_ROWS", "0", "LLAMA_CHAT_KERNEL_ROWS='0': give a whole number of tokens, 1 or more"),
    ("LLAMA_CHAT_PACKED_CACHE_GB", "-1", "LLAMA_CHAT_PACKED_CACHE_GB='-1': give the packed cache's bound"),
])
def test_a_bad_variable_is_one_line_naming_it(variable, value, message):
    with pytest.raises(LlamaChatError) as error:
        environment.kernel_options({variable: value})
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_the_group_timeout_and_the_folders_come_from_their_variables(tmp_path):
    assert environment.group_timeout({"LLAMA_CHAT_TP_TIMEOUT": "2.5"}).total_seconds() == 2.5
    with pytest.raises(LlamaChatError, match="LLAMA_CHAT_TP_TIMEOUT='soon' is not a number of seconds"):
        environment.group_timeout({"LLAMA_CHAT_TP_TIMEOUT": "soon"})
    folders = environment.folders({"LLAMA_CHAT_CACHE": "off", "LLAMA_CHAT_KERNELS_DIR": str(tmp_path)})
    assert folders.cache is None and folders.cache_off and folders.kernels == tmp_path
    assert environment.launched_place({"RANK": "2", "WORLD_SIZE": "4"}) == (2, 4)
    assert environment.launched_place({}) == (0, 1)


def model_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    return parser.parse_args(argv)


def test_the_kernel_dtype_flag_is_typed_and_wins_over_its_variable(capsys):
    assert model_flags().kernel_dtype is None  # auto
    assert model_flags("--kernel-dtype", "BF16").kernel_dtype is torch.bfloat16
    variable = {"LLAMA_CHAT_KERNEL_DTYPE": "float32"}
    assert load_options(model_flags("--kernel-dtype", "bfloat16"), variable).kernels.kernel_dtype is torch.bfloat16
    assert load_options(model_flags(), variable).kernels.kernel_dtype is torch.float32
    with pytest.raises(SystemExit):
        model_flags("--kernel-dtype", "float16")
    assert "argument --kernel-dtype: 'float16': use auto, bfloat16 or float32" in capsys.readouterr().err


def test_a_library_caller_may_name_kernel_dtypes_as_text():
    options = LoadOptions().replaced(kernel_dtype="bfloat16", matmul_dtype="auto", device="cpu")
    assert (options.kernels.kernel_dtype, options.kernels.matmul_dtype, options.device) == (torch.bfloat16, None, "cpu")
    with pytest.raises(LlamaChatError, match="kernel_dtype='int4'"):
        LoadOptions().replaced(kernel_dtype="int4")
    # The model's dtype is what a packed model's prompt steps multiply in.
    assert LoadOptions(dtype="BF16").packed_kernels().matmul_dtype is torch.bfloat16
    assert LoadOptions(dtype="auto").packed_kernels() == KernelOptions()
    with pytest.raises(LlamaChatError, match="unknown dtype 'float64'"):
        LoadOptions(dtype="float64").packed_kernels()


def test_draft_lengths():
    assert DraftLength.parse("auto") == DraftLength() and DraftLength.parse("auto").automatic
    assert DraftLength.parse("0") == DraftLength(0) and DraftLength(0).off and not DraftLength(0).automatic
    assert DraftLength.parse("5") == DraftLength(5) and DraftLength(5).most == 5
    assert [str(DraftLength()), str(DraftLength(3))] == ["auto", "3"]
    for bad in ("-1", "many", ""):
        with pytest.raises(UsageError, match="--lookup takes auto or a number of tokens"):
            DraftLength.parse(bad)
    with pytest.raises(UsageError, match="/lookup takes auto"):
        DraftLength.parse("x", "/lookup")


def test_a_child_is_given_what_this_process_hands_down(monkeypatch):
    monkeypatch.setattr(environment, "_handed_down", {})
    environment.hand_down(environment.LOADED_LIBRARY, "/some/library.so")
    child = environment.child_environment(OMP_NUM_THREADS="1")
    assert child[environment.LOADED_LIBRARY] == "/some/library.so" and child["OMP_NUM_THREADS"] == "1"
    assert environment.LOADED_LIBRARY not in os.environ  # this process's own environment is left as it was
    code = "from llama_chat import environment; print(environment.inherited_library())"
    result = subprocess.run([sys.executable, "-c", code], env=child, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "/some/library.so"


@pytest.mark.parametrize("variable, default, relative", [
    ("XDG_CONFIG_HOME", ".config", "."), ("XDG_STATE_HOME", ".local/state", "state"),
    ("XDG_CACHE_HOME", ".cache", "./cache"), ("XDG_DATA_HOME", ".local/share", "data/../data"),
])
def test_a_relative_xdg_base_folder_is_ignored(monkeypatch, tmp_path, variable, default, relative):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(variable, relative)
    assert paths.user_directory(variable, default) == tmp_path / "home" / default / "llama-chat"
    monkeypatch.setenv(variable, str(tmp_path / "base"))
    assert paths.user_directory(variable, default) == tmp_path / "base" / "llama-chat"


def test_the_hub_cache_ignores_a_relative_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    relative = HubSettings.from_environment({"XDG_CACHE_HOME": "cache"})
    assert relative.cache_dir == tmp_path / ".cache" / "huggingface" / "hub"
    absolute = HubSettings.from_environment({"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert absolute.cache_dir == tmp_path / "cache" / "huggingface" / "hub"
