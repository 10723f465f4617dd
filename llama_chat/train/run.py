"""A training run: the model, optimiser and data, the loop, and saving and resuming it.

The output directory is an ordinary Hugging Face-style checkpoint (config.json,
model.safetensors, tokenizer.model) that `llama-chat --model DIR --raw` loads, plus
training_state.pt (optimiser, step, random generators) for `--resume`, and
loss.png with the training and validation loss curves.
"""

from __future__ import annotations

import math
import pickle
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from llama_chat.checkpoints.contents import Checkpoint
from llama_chat.checkpoints.hf import load_hf_directory
from llama_chat.checkpoints.hf_writer import write_hf_files
from llama_chat.directories import staged_directory
from llama_chat.engine.model import Transformer
from llama_chat.engine.sampling import SamplingSettings
from llama_chat.errors import LlamaChatError
from llama_chat.llama import Llama
from llama_chat.text.sentencepiece_tokenizer import SentencePieceTokenizer
from llama_chat.train.config import TrainConfig, learning_rate
from llama_chat.train.data import (
    Corpus,
    check_length,
    encode,
    random_batch,
    read_corpus,
    train_tokenizer,
    validation_batches,
)
from llama_chat.train.plot import MISSING, terminal_loss_curve, write_loss_plot

STATE_FILE = "training_state.pt"
PLOT_FILE = "loss.png"


@dataclass
class LossLog:
    """Losses so far, (step, nats per token), for the plot and the progress line."""

    train: list[tuple[int, float]]
    validation: list[tuple[int, float]]


def init_for_training(transformer: Transformer, seed: int) -> None:
    """Small normal weights (residual outputs scaled down with depth), norm gains at 1."""
    generator = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * transformer.args.n_layers)
    with torch.no_grad():
        for name, parameter in transformer.named_parameters():
            if parameter.ndim == 1:
                parameter.fill_(1.0)
            else:
                std = residual_std if name.endswith(("wo.weight", "w2.weight")) else 0.02
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)


def make_optimizer(transformer: Transformer, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices only (decaying norm gains hurts)."""
    matrices = [p for p in transformer.parameters() if p.ndim >= 2]
    gains = [p for p in transformer.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": matrices, "weight_decay": config.weight_decay}, {"params": gains, "weight_decay": 0.0}],
        lr=config.learning_rate, betas=(0.9, 0.95),
    )


def batch_loss(transformer: Transformer, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    device = next(transformer.parameters()).device
    # bfloat16 autocast where the hardware has it; on the CPU it would only be slower.
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = transformer(inputs.to(device))
    return F.cross_entropy(logits.flatten(0, 1), targets.to(device).flatten())


@torch.no_grad()
def evaluate(transformer: Transformer, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean loss in nats per token over the fixed validation windows."""
    losses = [batch_loss(transformer, inputs, targets).item() * len(inputs) for inputs, targets in batches]
    return sum(losses) / sum(len(inputs) for inputs, _ in batches)


def sample_text(transformer: Transformer, tokenizer: SentencePieceTokenizer, tokens: int, seed: int) -> str:
    """A short continuation of <s>, sampled with a private generator (training's stay untouched)."""
    settings = SamplingSettings(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=seed, max_tokens=tokens)
    model = Llama(transformer, tokenizer, name="training")
    try:
        generation = model.generate([tokenizer.bos_id], settings, stop_ids=())
        return "".join(piece.text for piece in generation)
    finally:
        transformer.train()


class Run:
    """One training run: the model, optimiser, data and generators, and saving them."""

    def __init__(self, config: TrainConfig, corpus: Corpus, out: Path, device: torch.device,
                 tokenizer: SentencePieceTokenizer | None = None) -> None:
        self.config, self.corpus, self.out, self.device = config, corpus, out, device
        self.log_plot = False  # the loss plot's scale (a view, not a setting of the run)
        self.plotted = True  # whether the last save could draw the loss plot
        self.tokenizer = tokenizer or train_tokenizer(corpus.train_text, config.tokenizer, config.vocab_size)
        self.train_ids = encode(self.tokenizer, corpus.train_text)
        validation_ids = encode(self.tokenizer, corpus.validation_text)
        check_length(self.train_ids, config.context, "training")
        check_length(validation_ids, config.context, "validation")
        self.validation = validation_batches(validation_ids, config.batch_size, config.context,
                                             self.tokenizer.bos_id, config.eval_batches)
        self.args = config.model_args(self.tokenizer.vocab_size)
        self.transformer = Transformer(self.args)
        init_for_training(self.transformer, config.seed)
        self.transformer.to(device).train()
        self.optimizer = make_optimizer(self.transformer, config)
        self.data_generator = torch.Generator().manual_seed(config.seed)
        self.step = 0
        self.history = LossLog([], [])

    def train_step(self) -> float:
        """One optimiser step over `accumulate` micro-batches; returns the mean loss."""
        config = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(config, self.step)
        total = 0.0
        for _ in range(config.accumulate):
            inputs, targets = random_batch(self.train_ids, config.batch_size, config.context,
                                           self.tokenizer.bos_id, self.data_generator)
            loss = batch_loss(self.transformer, inputs, targets) / config.accumulate
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(self.transformer.parameters(), config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.history.train.append((self.step, total))
        return total

    def validate(self) -> float:
        loss = evaluate(self.transformer, self.validation)
        self.history.validation.append((self.step, loss))
        return loss

    def checkpoint(self) -> Checkpoint:
        state = {name: tensor.detach().float().cpu() for name, tensor in self.transformer.state_dict().items()}
        return Checkpoint(
            args=self.args, tensors=state, tokenizer=self.tokenizer, chat_template=None,
            bos_token=self.tokenizer.token_name(self.tokenizer.bos_id),
            eos_token=self.tokenizer.token_name(self.tokenizer.eos_id),
        )

    def training_state(self) -> dict:
        return {
            "config": asdict(self.config),
            "corpus_fingerprint": self.corpus.fingerprint,
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "data_generator": self.data_generator.get_state(),
            "history": asdict(self.history),
        }

    def plot_title(self) -> str:
        return f"{self.out.name}: {self.args.n_layers} layers of {self.args.dim}, {self.step} steps"

    def save(self) -> None:
        """Write the whole checkpoint beside `out`, then swap it in (see directories.py)."""
        with staged_directory(self.out, replace=True) as staging:
            write_hf_files(self.checkpoint(), staging, torch.float32)
            torch.save(self.training_state(), staging / STATE_FILE)
            self.plotted = write_loss_plot(staging / PLOT_FILE, self.history.train, self.history.validation,
                                           self.plot_title(), log_scale=self.log_plot)

    @classmethod
    def resume(cls, out: Path, data: list[str], device: torch.device) -> Run:
        """The run saved in `out`, exactly as it was after its last saved step."""
        try:
            state = torch.load(out / STATE_FILE, weights_only=True)
            config = TrainConfig(**state["config"])
        except (OSError, RuntimeError, pickle.UnpicklingError, TypeError, KeyError) as error:
            raise LlamaChatError(f"{out / STATE_FILE}: not a training state this version can resume ({error})") from None
        corpus = read_corpus(data, config.validation_fraction)
        if state["corpus_fingerprint"] != corpus.fingerprint:
            raise LlamaChatError(f"{out}: this run was trained on other data; --resume needs the same --data files")
        checkpoint = load_hf_directory(out)
        if not isinstance(checkpoint.tokenizer, SentencePieceTokenizer):
            raise LlamaChatError(f"{out}: not a llama-chat training run (no SentencePiece tokenizer)")
        run = cls(config, corpus, out, device, tokenizer=checkpoint.tokenizer)
        run.transformer.load_state_dict(checkpoint.state_dict(), strict=True)  # copies onto the run's device
        run.optimizer.load_state_dict(state["optimizer"])
        run.data_generator.set_state(state["data_generator"])
        run.step = state["step"]
        run.history = LossLog(**{k: [tuple(p) for p in v] for k, v in state["history"].items()})
        return run


class StopRequest:
    """Turns Ctrl-C into a request honoured between steps, so the saved state is whole."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self) -> StopRequest:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum, frame) -> None:
        if self.requested:  # a second Ctrl-C: the person wants out now
            raise KeyboardInterrupt
        self.requested = True


def train(run: Run, *, quiet: bool = False) -> bool:
    """Train until config.steps or Ctrl-C, saving along the way and at the end; True when finished."""
    config = run.config
    console = Console(quiet=quiet, stderr=True)
    tokens_per_step = config.batch_size * config.accumulate * config.context
    columns = (TextColumn("step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[status]}"),
               TimeRemainingColumn())
    with StopRequest() as stop, Progress(*columns, console=console) as progress:
        task = progress.add_task("train", total=config.steps, completed=run.step, status="")
        validation = f"{run.history.validation[-1][1]:.3f}" if run.history.validation else "-"
        speed = None
        while run.step < config.steps and not stop.requested:
            started = time.perf_counter()
            loss = run.train_step()
            step_speed = tokens_per_step / (time.perf_counter() - started)
            speed = step_speed if speed is None else 0.9 * speed + 0.1 * step_speed  # smoothed for reading
            evaluating = run.step % config.eval_every == 0 or run.step == config.steps
            if evaluating:
                validation = f"{run.validate():.3f}"
            status = f"{speed:,.0f} tok/s  train {loss:.3f}  val {validation}"
            if evaluating and not console.is_terminal:  # a log gets a line per evaluation, not a live bar
                progress.console.print(f"step {run.step}/{config.steps}  {status}", highlight=False)
            if config.sample_every and run.step % config.sample_every == 0:
                text = sample_text(run.transformer, run.tokenizer, config.sample_tokens, config.seed + run.step)
                progress.console.print(f"[bold]sample at step {run.step}:[/bold]")
                progress.console.print(text, markup=False, highlight=False)
            if run.step % config.save_every == 0 and run.step < config.steps:
                run.save()
            progress.update(task, completed=run.step, status=status)
        run.save()
    curve = terminal_loss_curve(run.history.train, run.history.validation, run.plot_title())
    if curve is not None:
        console.print(curve, markup=False, highlight=False)
    if curve is None or not run.plotted:
        console.print(MISSING, markup=False, highlight=False)
    if stop.requested:
        console.print(f"interrupted: saved step {run.step} to {run.out}; continue with --resume")
    return not stop.requested
