"""The Llama Transformer: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU; and the
switches its descendants turn (ModelArgs): Gemma's GELU gate, norms around each sublayer,
sliding-window layers with a rotation of their own and soft-capped scores and logits.

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
from llama_chat.engine.rope import apply_rotary, rope_tables, windowed_rotation

# The rotary tables' buffers: each as long as the positions the caches made need (see
# Transformer.fit_rope), not the model's whole context (32,768 for Gemma 3: 134 MB of tables).
ROTARY_TABLES = ("rope_cos", "rope_sin", "rope_local_cos", "rope_local_sin")


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
    """Causal self-attention with grouped key/value heads, over a KV cache when one is given."""

    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.layer = layer  # its index: where the cache keeps its keys and values
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        self.n_rep = args.n_rep
        self.scale = args.attention_scale or args.head_dim**-0.5
        self.softcap = args.attention_softcap  # scores capped to softcap * tanh(score / softcap), or None
        # A windowed layer's token sees itself and the window - 1 positions before it (None: all before it).
        self.window = args.sliding_window if args.is_windowed(layer) else None
        self.wqkv = UninitializedLinear(args.dim, (args.n_heads + 2 * args.n_kv_heads) * args.head_dim)
        self.wo = UninitializedLinear(args.n_heads * args.head_dim, args.dim)
        # Apart from wqkv, so that any packing of the matrix leaves them as they are.
        rows = (args.n_heads + 2 * args.n_kv_heads) * args.head_dim
        self.qkv_bias = nn.Parameter(torch.empty(rows)) if args.qkv_bias else None
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        # A kernel that attends over the cache in one call (llama-chat's, set at load), or
        # None: PyTorch's operations below.
        self.cache_attention: nn.Module | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                cache=None) -> torch.Tensor:
        """x [batch, time, dim] attends causally to itself and, with a cache call (batch 1, see
        engine/cache), to the positions the cache holds; its keys and values go to the call."""
        q, k, v = self._project(x, cos, sin)
        if cache is None:
            out = self._attend_within(q, k, v, mask)
        else:
            past_keys, past_values, past_mask = cache.update_and_fetch(self.layer, k[0], v[0])
            # The slots scored: the first `position` (all visible), or a windowed layer's whole ring under its bias.
            held = cache.position if past_mask is None else past_mask.shape[-1]
            if self.cache_attention is not None:  # mask: the causal (windowed) one, which the kernel applies itself
                out = self.cache_attention(q[0], k[0], v[0], past_keys, past_values, held, self.scale,
                                           self.window, self.softcap, past_mask)
            else:
                out = self._attend_after(q[0], k[0], v[0], mask, past_keys, past_values, past_mask, held)
        return self.wo(out.reshape(x.shape[0], x.shape[1], -1))

    def _attend_within(self, q, k, v, mask):
        """Attention among the tokens of x alone [batch, time, heads, head_dim] (no cache)."""
        batch, time = q.shape[:2]
        # Put the n_rep query heads that share a key/value head next to each other
        # along the time axis, so attention broadcasts over K/V without repeating them.
        q = q.view(batch, time, self.n_kv_heads, self.n_rep, self.head_dim)
        q = q.permute(0, 2, 3, 1, 4).reshape(batch, self.n_kv_heads, self.n_rep * time, self.head_dim)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if self.softcap is None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        else:  # capped scores: a step SDPA does not take
            scores = self._capped(torch.matmul(q * self.scale, k.transpose(2, 3)))
            out = torch.matmul(torch.softmax(scores if mask is None else scores + mask, dim=-1), v)
        return out.view(batch, self.n_kv_heads, self.n_rep, time, self.head_dim).permute(0, 3, 1, 2, 4)

    def _capped(self, scores: torch.Tensor) -> torch.Tensor:
        return scores if self.softcap is None else torch.tanh(scores / self.softcap) * self.softcap

    def _attend_after(self, q, k, v, mask, past_keys, past_values, past_mask, held):
        """Attention of new tokens (q [time, heads, head_dim], k and v [time, kv_heads,
        head_dim]) over the first `held` slots of past_keys and past_values [kv_heads,
        capacity, head_dim] and over themselves under mask: with past_mask None, all visible;
        else with past_mask [time, held] added to each token's scores (a windowed layer's
        ring, see engine/cache).

        The cached positions and the new ones are scored apart and weighed by one softmax,
        so the new tokens are attended in the model's precision whatever the cache's.
        """
        time = q.shape[0]
        # [kv_heads, n_rep * time, head_dim]: the query heads sharing a key/value head side by side.
        q = q.view(time, self.n_kv_heads, self.n_rep, self.head_dim).permute(1, 2, 0, 3)
        q = q.reshape(self.n_kv_heads, self.n_rep * time, self.head_dim) * self.scale
        k, v = k.transpose(0, 1), v.transpose(0, 1)
        # A cache kept in a narrower dtype (--kv-dtype) is read in the model's.
        # (narrow, not slices: an exported call's position is a value, which a slice's clamping cannot bound)
        past_keys, past_values = past_keys.narrow(1, 0, held).to(q.dtype), past_values.narrow(1, 0, held).to(q.dtype)
        past_scores = self._capped(torch.matmul(q, past_keys.transpose(1, 2)))
        if past_mask is not None:  # a token's row for each of its query heads (rows head-major, as q's)
            past_scores = past_scores + past_mask.to(q.dtype).repeat(self.n_rep, 1)
        new_scores = self._capped(torch.matmul(q, k.transpose(1, 2)))
        if mask is not None:
            new_scores = new_scores + mask
        weights = torch.softmax(torch.cat([past_scores, new_scores], dim=-1), dim=-1)
        out = torch.matmul(weights.narrow(-1, 0, held), past_values)
        out = out + torch.matmul(weights.narrow(-1, held, time), v)
        return out.view(self.n_kv_heads, self.n_rep, time, self.head_dim).permute(2, 0, 1, 3)

    def _project(self, x, cos, sin):
        """Rotated queries and keys and the values of x [batch, time, dim], each [batch, time, heads, head_dim]."""
        batch, time, _ = x.shape
        rotated_heads = self.n_heads + self.n_kv_heads
        qkv = self.wqkv(x)
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        qkv = qkv.view(batch, time, rotated_heads + self.n_kv_heads, self.head_dim)
        qk = qkv.narrow(2, 0, rotated_heads)
        if self.q_norm is not None:
            qk = torch.cat([self.q_norm(qk.narrow(2, 0, self.n_heads)),
                            self.k_norm(qk.narrow(2, self.n_heads, self.n_kv_heads))], dim=2)
        qk = apply_rotary(qk, cos, sin)
        q, k = qk.narrow(2, 0, self.n_heads), qk.narrow(2, self.n_heads, self.n_kv_heads)
        return q, k, qkv.narrow(2, rotated_heads, self.n_kv_heads)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(gate(x)) * up(x)), with gate and up in one matrix; Gemma's gate goes
    through GELU (its tanh approximation) instead."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w13 = UninitializedLinear(args.dim, 2 * args.hidden_dim)
        self.w2 = UninitializedLinear(args.hidden_dim, args.dim)
        self.gelu = args.gelu_feed_forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        gated = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.w2(gated * up)


class Block(nn.Module):
    """One pre-norm Transformer layer: attention then feed-forward, each with a residual (with
    sandwich norms, each sublayer's output normed again before it is added: Gemma's)."""

    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args, layer)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)
        self.post_attention_norm = RMSNorm(args.dim, args.norm_eps) if args.sandwich_norms else None
        self.post_ffn_norm = RMSNorm(args.dim, args.norm_eps) if args.sandwich_norms else None
        self.residual_scale = args.residual_scale

    def forward(self, x, cos, sin, mask, cache=None):
        attended = self.attention(self.attention_norm(x), cos, sin, mask, cache)
        x = x + self._residual(attended, self.post_attention_norm)
        return x + self._residual(self.feed_forward(self.ffn_norm(x)), self.post_ffn_norm)

    def _residual(self, output, post_norm):
        if post_norm is not None:
            output = post_norm(output)
        return output if self.residual_scale == 1.0 else output * self.residual_scale


class Transformer(nn.Module):
    """The whole model: token ids in, next-token logits (float32) out."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        # Given a table, Embedding skips its random init (see UninitializedLinear).
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim, _weight=torch.empty(args.vocab_size, args.dim))
        self.layers = nn.ModuleList(Block(args, layer) for layer in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = UninitializedLinear(args.dim, args.vocab_size)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.long_rope = False  # longrope's long factors in the tables (see fit_rope)
        # The windowed layers' own rotation (Gemma 3), else None: every layer turns alike.
        self.local_rotation = windowed_rotation(args)
        # On the cpu even while a model is laid out on the meta device (loading does that);
        # empty until a cache needs positions (fit_rope).
        for name in self.rotary_table_names:
            self.register_buffer(name, torch.empty(0, 1, args.head_dim, device="cpu"), persistent=False)

    @property
    def rotary_table_names(self) -> tuple[str, ...]:
        """The rotary tables this model holds (of ROTARY_TABLES), in the order _rope makes them."""
        return ROTARY_TABLES[: 2 if self.local_rotation is None else 4]

    def fit_rope(self, context: int) -> None:
        """Rotary tables for a cache of `context` positions: grown to hold them (never shrunk:
        an earlier, longer cache may still be in use), turning with longrope's long factors
        beyond its original context, as llama.cpp chooses (the latest cache made decides).
        The tables change in place: a compiled call holds these tensors."""
        long_rope = self.args.rope_scaling.uses_long_factors(context)
        positions = max(context, self.rope_cos.shape[0])
        if long_rope != self.long_rope or positions > self.rope_cos.shape[0]:
            self._fill_rope(positions, long_rope)

    def _fill_rope(self, positions: int, long_rope: bool) -> None:
        with torch.no_grad():
            for name, table in zip(self.rotary_table_names, self._rope(positions, long_rope)):
                held = getattr(self, name)
                held.set_(table.to(held.device, held.dtype))
        self.long_rope = long_rope

    def _rope(self, positions: int, long_rope: bool) -> tuple[torch.Tensor, ...]:
        """cos and sin for `positions` positions, then the windowed layers' own, if any."""
        tables = rope_tables(self.args, positions, long_context=long_rope)
        if self.local_rotation is not None:
            tables += rope_tables(self.local_rotation, positions)
        return tables

    def forward(self, tokens: torch.Tensor, cache=None, *, last_only: bool = False,
                head: bool = True) -> torch.Tensor | None:
        """Float32 logits [batch, time, vocab] for tokens [batch, time]: from position 0 with no
        cache (training, checks against references), or (batch 1) after the positions a
        KVCache holds, which then holds these tokens too. With last_only, the last token's
        logits only [batch, 1, vocab] (a prompt chunk needs no more); with head false, none
        (a prompt's chunks before its last: their keys and values are what counts)."""
        x = self.tok_embeddings(tokens)
        if cache is None:
            return self.forward_embeddings(x, last_only=last_only, head=head)
        if cache.capacity > self.rope_cos.shape[0]:  # a cache made otherwise than by Llama.new_cache
            self._fill_rope(cache.capacity, self.long_rope)
        call = cache.call(tokens.shape[1])
        logits = self.forward_embeddings(x, call, last_only=last_only, head=head)
        cache.write(tokens[0].tolist(), *call.new_entries())
        return logits

    def forward_embeddings(self, x: torch.Tensor, cache=None, *, last_only: bool = False,
                           head: bool = True) -> torch.Tensor | None:
        """forward from the tokens' embeddings x [batch, time, dim] on: the model's arithmetic
        (a lookup is not, and a compiled call takes embeddings: see engine/compiled). The
        cache is a CacheCall (see engine/cache), which the caller writes to the cache after."""
        time = x.shape[1]
        position = 0 if cache is None else cache.position
        if self.args.embedding_scale != 1.0:
            x = x * self.args.embedding_scale
        tables = [getattr(self, name) for name in self.rotary_table_names]
        long_rope = self.args.rope_scaling.uses_long_factors(time)
        if cache is None and (time > tables[0].shape[0] or long_rope != self.long_rope):
            # A whole sequence turns as its length asks (as transformers does), the held tables untouched.
            tables = self._rope(time, long_rope)
        elif position + time > tables[0].shape[0]:
            raise ValueError(f"position {position + time} is past the rotary tables' {tables[0].shape[0]} positions "
                             "(they grow with each cache Llama.new_cache makes)")
        cos, sin, *local = tables
        window = self.args.sliding_window
        # What a layer turns and masks by: by whether it is windowed.
        kinds = {False: self._positions(cos, sin, position, time, x, None)}
        if self.args.windowed_layers:
            kinds[True] = self._positions(*(local or (cos, sin)), position, time, x, window)
        for layer in self.layers:
            x = layer(x, *kinds[layer.attention.window is not None], cache)
        if not head:
            return None
        if last_only:
            x = x[:, -1:]
        logits = self.output(self.norm(x)).float()
        if self.args.logit_softcap is not None:
            logits = torch.tanh(logits / self.args.logit_softcap) * self.args.logit_softcap
        return logits if self.args.logit_scale == 1.0 else logits / self.args.logit_scale

    def _positions(self, cos, sin, position, time, x, window):
        """cos and sin of the tokens' positions, and the mask among them."""
        # Rows picked by index, not narrowed: a compiled call's tables are as long as they come,
        # and a narrow at a position read in the call has a length export cannot settle.
        rows = torch.arange(position, position + time, device=cos.device)
        turning = [table.index_select(0, rows).to(x.device, x.dtype) for table in (cos, sin)]
        return (*turning, causal_mask(time, self.args.n_rep, x.device, x.dtype, window))


def causal_mask(
    time: int, n_rep: int, device: torch.device, dtype: torch.dtype, window: int | None = None
) -> torch.Tensor | None:
    """Additive mask [n_rep*time, time] among `time` tokens for the grouped query rows: 0
    where a key is visible, -inf where it is in the future (or, with a window, window or
    more positions back).

    Made once per call in the model's dtype: a boolean mask would be converted to this
    inside every layer's attention call. A single token needs no mask at all.
    """
    if time == 1:
        return None
    positions = torch.arange(time, device=device)
    hidden = positions[None, :] > positions[:, None]
    if window is not None:
        hidden |= positions[:, None] - positions[None, :] >= window
    mask = torch.zeros(hidden.shape, device=device, dtype=dtype).masked_fill_(hidden, float("-inf"))
    return mask.repeat(n_rep, 1)
