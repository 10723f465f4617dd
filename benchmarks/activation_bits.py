"""What 8-bit activations would cost in fidelity: every matrix input of the float32 model
rounded per group of 32 as llama-chat's kernels round it, teacher-forced over the text of
fidelity.py, against the unrounded model (same top token, mean KL divergence).

Schemes: all groups at 16 bits (what the kernels do), all at 8 bits (what llama.cpp's
Q8 activation blocks do), 8 bits for the inputs of one kind of matrix only (wqkv, wo, w13,
w2: per tensor, the rest at 16), 8 bits for the normed inputs (wqkv, w13) only, and 8 bits with the groups whose 8-bit rounding error is largest
against their row promoted to 16 bits (a group is promoted when its squared error exceeds
`share` times the row's energy a group), at several shares: the fraction promoted is
printed beside, so the integer work saved is about half of the rest.

    .venv/bin/python benchmarks/activation_bits.py [--model FILE.gguf] [--positions 256]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import llama_chat
from llama_chat.cli.options import configure_folders
from llama_chat.default_model import DEFAULT_MODEL, download_model
from llama_chat.environment import kernel_options
from llama_chat.options import LoadOptions

from fidelity import TEXT  # noqa: E402 (a sibling script)

GROUP = 32
LEVELS = {8: 127.0, 16: 32385.0}  # largest level a group's largest magnitude maps to
SHARES = (1e-3, 3e-4, 1e-4, 3e-5)
KINDS = ("wqkv", "wo", "w13", "w2")  # a layer's matrices, by the name of their module


def rounded(groups: torch.Tensor, bits: int) -> torch.Tensor:
    """x [..., GROUP] rounded to its group's levels, as the kernels' quantize_rows does."""
    step = groups.abs().amax(-1, keepdim=True) / LEVELS[bits]
    inverse = torch.where(step > 0, 1 / step, torch.zeros_like(step))
    return torch.round(groups * inverse).clamp(-LEVELS[bits], LEVELS[bits]) * step


class Rounding:
    """A forward pre-hook rounding each matrix input; counts the groups sent to 16 bits."""

    def __init__(self, share: float | None) -> None:
        self.share = share  # None: every group at 8 bits; 0: every group at 16
        self.groups = self.promoted = 0

    def __call__(self, module: nn.Module, inputs: tuple[torch.Tensor]) -> tuple[torch.Tensor]:
        x = inputs[0]
        groups = x.reshape(-1, x.shape[-1] // GROUP, GROUP)
        low, high = rounded(groups, 8), rounded(groups, 16)
        if self.share is None:
            promote = torch.zeros_like(groups[..., :1], dtype=torch.bool)
        else:
            error = (groups - low).square().sum(-1, keepdim=True)
            energy = groups.square().sum((-1, -2), keepdim=True) / groups.shape[1]
            promote = error >= self.share * energy
        self.groups += promote.numel()
        self.promoted += int(promote.sum())
        return (torch.where(promote, high, low).reshape(x.shape),)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--positions", type=int, default=256)
    options = parser.parse_args()
    configure_folders()  # as the command line does, from the LLAMA_CHAT_* variables
    environment = LoadOptions(kernels=kernel_options())
    model = llama_chat.load(options.model or str(download_model(DEFAULT_MODEL)), environment, device="cpu",
                            dtype="float32")
    tokens = torch.tensor([model.tokenizer.encode(TEXT * 4)[: options.positions]])
    linears = {name: m for name, m in model.transformer.named_modules() if isinstance(m, nn.Linear)}
    with torch.no_grad():
        reference = model.transformer(tokens)[0].log_softmax(-1)
    print(f"{model.name}: {tokens.shape[1]} positions, every matrix input rounded per group of {GROUP}")
    schemes = [("16 bits", 0.0, KINDS), ("8 bits", None, KINDS)]
    schemes += [(f"8 for {kind} only", None, (kind,)) for kind in KINDS]
    schemes += [("8 for wqkv and w13", None, ("wqkv", "w13"))]
    for name, share, kinds in schemes + [(f"8, promoted at {s:g}", s, KINDS) for s in SHARES]:
        rounding, at_16 = Rounding(share), Rounding(0.0)
        hooks = [linear.register_forward_pre_hook(rounding if key.rsplit(".", 1)[-1] in kinds else at_16)
                 for key, linear in linears.items()]
        with torch.no_grad():
            got = model.transformer(tokens)[0].log_softmax(-1)
        for hook in hooks:
            hook.remove()
        same = float((got.argmax(-1) == reference.argmax(-1)).float().mean())
        divergence = float((reference.exp() * (reference - got)).sum(-1).mean())
        print(f"{name:>22}: same top token {same:.3f}, KL divergence {divergence:.2e}, "
              f"groups at 16 bits {(rounding.promoted + at_16.groups) / (rounding.groups + at_16.groups):.3f}")


if __name__ == "__main__":
    main()
