"""The Llama Transformer: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU.

Conventions that the checkpoint loaders convert to:
- rotary embeddings rotate halves of each head, (x[:d/2], x[d/2:]) (the Hugging Face
  layout); Meta and GGUF checkpoints rotate interleaved pairs and are permuted on load;
- the query, key and value projections are one matrix `wqkv` (rows q, then k, then v)
  and the SwiGLU gate and up projections are one matrix `w13` (rows gate, then up),
  so that a decode step makes two matrix calls fewer per block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llama_chat.engine.config import ModelArgs
from llama_chat.engine.rope import apply_rotary, rope_tables


class UninitializedLinear(nn.Linear):
    """A bias-free linear layer whose weight starts as uninitialised memory.

    Every weight is loaded from a checkpoint or set by init_random_weights, so the
    default random init would only cost time (seconds for a whole model).
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)

    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    """Scales each token's feature vector to unit root-mean-square, then by a learnt gain."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Over the last (feature) dimension only, in float32 whatever the model's dtype.
        x32 = x.float()
        inverse_rms = x32.square().mean(dim=-1, keepdim=True).add_(self.eps).rsqrt_()
        return self.weight * (x32 * inverse_rms).to(x.dtype)


class Attention(nn.Module):
    """Causal self-attention with grouped key/value heads, reading and writing a KV cache."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        self.n_rep = args.n_rep
        self.wqkv = UninitializedLinear(args.dim, (args.n_heads + 2 * args.n_kv_heads) * args.head_dim)
        self.wo = UninitializedLinear(args.n_heads * args.head_dim, args.dim)
        # A kernel that attends over the cache in one call (llama-chat's, set at load), or
        # None: PyTorch's operations below.
        self.cache_attention: nn.Module | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Causal attention within x [batch, time, dim] alone (no cache): the whole-sequence pass."""
        batch, time, _ = x.shape
        q, k, v = self._project(x, cos, sin)
        # Put the n_rep query heads that share a key/value head next to each other
        # along the time axis, so attention broadcasts over K/V without repeating them.
        q = q.view(batch, time, self.n_kv_heads, self.n_rep, self.head_dim)
        q = q.permute(0, 2, 3, 1, 4).reshape(batch, self.n_kv_heads, self.n_rep * time, self.head_dim)
        out = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        out = out.view(batch, self.n_kv_heads, self.n_rep, time, self.head_dim)
        return self.wo(out.permute(0, 3, 1, 2, 4).reshape(batch, time, -1))

    def step(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_bias: torch.Tensor,
        new_bias: torch.Tensor | None,
        past_keys: torch.Tensor,
        past_values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """New tokens x [1, time, dim] after the len(past_bias) positions held in past_keys and
        past_values [1, kv_heads, capacity, head_dim]; returns the output and the new tokens'
        keys and values [kv_heads, time, head_dim], which the caller writes to the cache.

        The cached positions and the new ones are scored apart (the new ones under new_bias,
        the causal mask among them; None for a single token) and weighed by one softmax, so
        nothing is written here: the step is free of mutation, its shapes depend on the
        position only through past_bias's length, and it compiles once.
        """
        time = x.shape[1]
        position = past_bias.shape[0]
        q, k, v = self._project(x, cos, sin)
        if self.cache_attention is not None:
            # new_bias is the causal mask among the new tokens, which the kernel applies itself.
            out = self.cache_attention(q[0], k[0], v[0], past_keys[0], past_values[0], past_bias)
            # Copies, not views of the projection: a prompt chunk holds every layer's until the
            # cache takes them, and the projections whole would be 2.5 times the bytes.
            k, v = k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous()
            return self.wo(out.reshape(1, time, -1)), k, v
        # [kv_heads, n_rep * time, head_dim]: the query heads sharing a key/value head side by side.
        q = q[0].view(time, self.n_kv_heads, self.n_rep, self.head_dim).permute(1, 2, 0, 3)
        q = q.reshape(self.n_kv_heads, self.n_rep * time, self.head_dim) * self.head_dim**-0.5
        k, v = k[0].transpose(0, 1), v[0].transpose(0, 1)
        # A cache kept in a narrower dtype (--kv-dtype) is read in the model's.
        past_keys, past_values = past_keys[0, :, :position].to(q.dtype), past_values[0, :, :position].to(q.dtype)
        past_scores = torch.matmul(q, past_keys.transpose(1, 2)) + past_bias.to(q.dtype)
        new_scores = torch.matmul(q, k.transpose(1, 2))
        if new_bias is not None:
            new_scores = new_scores + new_bias
        weights = torch.softmax(torch.cat([past_scores, new_scores], dim=-1), dim=-1)
        out = torch.matmul(weights[..., :position], past_values)
        out = out + torch.matmul(weights[..., position:], v)
        out = out.view(self.n_kv_heads, self.n_rep, time, self.head_dim).permute(2, 0, 1, 3)
        return self.wo(out.reshape(1, time, -1)), k, v

    def _project(self, x, cos, sin):
        """Rotated queries and keys and the values of x [batch, time, dim], each [batch, time, heads, head_dim]."""
        batch, time, _ = x.shape
        rotated_heads = self.n_heads + self.n_kv_heads
        qkv = self.wqkv(x).view(batch, time, rotated_heads + self.n_kv_heads, self.head_dim)
        qk = apply_rotary(qkv.narrow(2, 0, rotated_heads), cos, sin)
        q, k = qk.narrow(2, 0, self.n_heads), qk.narrow(2, self.n_heads, self.n_kv_heads)
        return q, k, qkv.narrow(2, rotated_heads, self.n_kv_heads)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(gate(x)) * up(x)), with gate and up in one matrix."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w13 = UninitializedLinear(args.dim, 2 * args.hidden_dim)
        self.w2 = UninitializedLinear(args.hidden_dim, args.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    """One pre-norm Transformer layer: attention then feed-forward, each with a residual."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x, cos, sin, mask):
        x = x + self.attention(self.attention_norm(x), cos, sin, mask)
        return x + self.feed_forward(self.ffn_norm(x))

    def step(self, x, cos, sin, past_bias, new_bias, past_keys, past_values):
        attended, k, v = self.attention.step(self.attention_norm(x), cos, sin, past_bias, new_bias, past_keys,
                                             past_values)
        x = x + attended
        return x + self.feed_forward(self.ffn_norm(x)), k, v


class Transformer(nn.Module):
    """The whole model: token ids in, next-token logits (float32) out."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        # Given a table, Embedding skips its random init (see UninitializedLinear).
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim, _weight=torch.empty(args.vocab_size, args.dim))
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = UninitializedLinear(args.dim, args.vocab_size)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(args, args.max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Float32 logits [batch, time, vocab] for whole sequences tokens [batch, time] from
        position 0, no cache involved (training, and checks against references)."""
        time = tokens.shape[1]
        if time > self.rope_cos.shape[0]:
            raise ValueError(f"position {time} is past the model's context of {self.rope_cos.shape[0]}")
        x = self.tok_embeddings(tokens)
        cos, sin = self.rope_cos[:time].to(x.dtype), self.rope_sin[:time].to(x.dtype)
        mask = causal_mask(time, self.args.n_rep, tokens.device, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.output(self.norm(x)).float()

    def step(
        self,
        x: torch.Tensor,
        past_bias: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The model on a cache: float32 logits [time, vocab] for the tokens whose embeddings
        are x [1, time, dim] (`tok_embeddings(tokens)`, looked up by the caller: a lookup is
        not a step's arithmetic, and stays out of the compiled step), standing at positions
        len(past_bias).., and their keys and values for every layer
        [n_layers, kv_heads, time, head_dim]. With last_only, logits for the last token only
        [1, vocab] (a prompt chunk needs no more).

        keys and values are a KVCache's whole buffers, read up to that position and not
        written; past_bias [position] is added to the attention scores of the cached
        positions (zeros: all visible). Every shape is fixed but that length and the number
        of tokens, so one compiled graph serves every single-token step (see compiled_step).
        """
        time = x.shape[1]
        position = past_bias.shape[0]
        if position + time > self.rope_cos.shape[0]:
            raise ValueError(f"position {position + time} is past the model's context of {self.rope_cos.shape[0]}")
        cos = self.rope_cos[position : position + time].to(x.dtype)
        sin = self.rope_sin[position : position + time].to(x.dtype)
        new_bias = causal_mask(time, self.args.n_rep, x.device, x.dtype)
        new_keys, new_values = [], []
        for layer, past_keys, past_values in zip(self.layers, keys.unbind(0), values.unbind(0)):
            x, k, v = layer.step(x, cos, sin, past_bias, new_bias, past_keys, past_values)
            new_keys.append(k)
            new_values.append(v)
        if last_only:
            x = x[:, -1:]
        logits = self.output(self.norm(x)).float()
        return logits[0], torch.stack(new_keys), torch.stack(new_values)


def causal_mask(time: int, n_rep: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
    """Additive mask [n_rep*time, time] among `time` tokens for the grouped query rows: 0
    where a key is visible, -inf where it is in the future.

    Made once per call in the model's dtype: a boolean mask would be converted to this
    inside every layer's attention call. A single token needs no mask at all.
    """
    if time == 1:
        return None
    positions = torch.arange(time, device=device)
    future = positions[None, :] > positions[:, None]
    mask = torch.zeros(future.shape, device=device, dtype=dtype).masked_fill_(future, float("-inf"))
    return mask.repeat(n_rep, 1)
