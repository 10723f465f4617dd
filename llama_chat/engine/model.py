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

from llama_chat.engine.cache import KVCache
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

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        layer_cache: tuple[torch.Tensor, torch.Tensor] | None,
        start_pos: int,
    ) -> torch.Tensor:
        batch, time, _ = x.shape
        rotated_heads = self.n_heads + self.n_kv_heads
        qkv = self.wqkv(x).view(batch, time, rotated_heads + self.n_kv_heads, self.head_dim)
        qk = apply_rotary(qkv.narrow(2, 0, rotated_heads), cos, sin)
        q, k = qk.narrow(2, 0, self.n_heads), qk.narrow(2, self.n_heads, self.n_kv_heads).transpose(1, 2)
        v = qkv.narrow(2, rotated_heads, self.n_kv_heads).transpose(1, 2)
        if layer_cache is not None:
            cache_k, cache_v = layer_cache
            cache_k.narrow(2, start_pos, time).copy_(k)
            cache_v.narrow(2, start_pos, time).copy_(v)
            k, v = cache_k.narrow(2, 0, start_pos + time), cache_v.narrow(2, 0, start_pos + time)
        # Put the n_rep query heads that share a key/value head next to each other
        # along the time axis, so attention broadcasts over K/V without repeating them.
        q = q.view(batch, time, self.n_kv_heads, self.n_rep, self.head_dim)
        q = q.permute(0, 2, 3, 1, 4).reshape(batch, self.n_kv_heads, self.n_rep * time, self.head_dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.view(batch, self.n_kv_heads, self.n_rep, time, self.head_dim)
        return self.wo(out.permute(0, 3, 1, 2, 4).reshape(batch, time, -1))

    def decode(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_bias: torch.Tensor,
        past_keys: torch.Tensor,
        past_values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One new token x [1, 1, dim] after the len(past_bias) positions held in past_keys and
        past_values [1, kv_heads, capacity, head_dim]; returns the output and the token's key
        and value [kv_heads, head_dim], which the caller writes to the cache.

        Nothing here depends on the position except through past_bias's length, so the
        step's shapes are the same at every position and it compiles once. The new key is
        scored on its own rather than written first, which keeps the step free of mutation.
        """
        position = past_bias.shape[0]
        rotated_heads = self.n_heads + self.n_kv_heads
        qkv = self.wqkv(x).view(rotated_heads + self.n_kv_heads, self.head_dim)
        qk = apply_rotary(qkv[:rotated_heads], cos, sin)
        q = qk[: self.n_heads].view(self.n_kv_heads, self.n_rep, self.head_dim) * self.head_dim**-0.5
        k, v = qk[self.n_heads :], qkv[rotated_heads:]
        past_scores = torch.matmul(q, past_keys[0, :, :position].transpose(1, 2)) + past_bias
        new_scores = (q * k[:, None]).sum(-1, keepdim=True)
        weights = torch.softmax(torch.cat([past_scores, new_scores], dim=-1), dim=-1)
        out = torch.matmul(weights[..., :position], past_values[0, :, :position]) + weights[..., position:] * v[:, None]
        return self.wo(out.reshape(1, 1, -1)), k, v


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

    def forward(self, x, cos, sin, mask, layer_cache, start_pos):
        x = x + self.attention(self.attention_norm(x), cos, sin, mask, layer_cache, start_pos)
        return x + self.feed_forward(self.ffn_norm(x))

    def decode(self, x, cos, sin, past_bias, past_keys, past_values):
        attended, k, v = self.attention.decode(self.attention_norm(x), cos, sin, past_bias, past_keys, past_values)
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

    def forward(
        self,
        tokens: torch.Tensor,
        start_pos: int = 0,
        cache: KVCache | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Logits for tokens [batch, time] standing at positions start_pos.. .

        With a cache, K/V are written at [start_pos, start_pos+time) and attention runs
        over [0, start_pos+time); without one, start_pos must be 0. `last_only` returns
        logits for the final position only ([batch, 1, vocab]), which is all decoding needs.
        """
        time = tokens.shape[1]
        end = start_pos + time
        if cache is None and start_pos:
            raise ValueError("start_pos > 0 needs a KV cache holding the earlier positions")
        if cache is not None and tokens.shape[0] != 1:
            raise ValueError(f"a KV cache holds one sequence, not a batch of {tokens.shape[0]}")
        if end > self.rope_cos.shape[0]:
            raise ValueError(f"position {end} is past the model's context of {self.rope_cos.shape[0]}")
        x = self.tok_embeddings(tokens)
        cos = self.rope_cos[start_pos:end].to(x.dtype)
        sin = self.rope_sin[start_pos:end].to(x.dtype)
        mask = causal_mask(start_pos, time, self.args.n_rep, tokens.device, x.dtype)
        for index, layer in enumerate(self.layers):
            layer_cache = cache.layer(index) if cache is not None else None
            x = layer(x, cos, sin, mask, layer_cache, start_pos)
        if last_only:
            x = x[:, -1:]
        return self.output(self.norm(x)).float()

    def decode(
        self, token: torch.Tensor, past_bias: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One decode step: the float32 logits [vocab] for token [1, 1] standing at position
        len(past_bias), and its keys and values for every layer [n_layers, kv_heads, head_dim].

        keys and values are a KVCache's whole buffers, read up to that position and not
        written; past_bias [position] is added to the attention scores of the cached
        positions (zeros: all visible). Every shape is fixed but that length, so one
        compiled graph serves every step (see compiled_step).
        """
        position = past_bias.shape[0]
        x = self.tok_embeddings(token)
        cos, sin = self.rope_cos[position].to(x.dtype), self.rope_sin[position].to(x.dtype)
        new_keys, new_values = [], []
        for layer, past_keys, past_values in zip(self.layers, keys.unbind(0), values.unbind(0)):
            x, k, v = layer.decode(x, cos, sin, past_bias, past_keys, past_values)
            new_keys.append(k)
            new_values.append(v)
        logits = self.output(self.norm(x)).float()
        return logits[0, 0], torch.stack(new_keys), torch.stack(new_values)


def causal_mask(
    start_pos: int, time: int, n_rep: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor | None:
    """Additive mask [n_rep*time, start_pos+time] for the grouped query rows: 0 where a key
    is visible, -inf where it is in the future.

    Made once per forward pass in the model's dtype: a boolean mask would be converted
    to this inside every layer's attention call. A single new token may see every
    cached position, so it needs no mask at all.
    """
    if time == 1:
        return None
    query_positions = torch.arange(start_pos, start_pos + time, device=device)
    key_positions = torch.arange(start_pos + time, device=device)
    future = key_positions[None, :] > query_positions[:, None]
    mask = torch.zeros(future.shape, device=device, dtype=dtype).masked_fill_(future, float("-inf"))
    return mask.repeat(n_rep, 1)
