"""An independent Llama forward pass in NumPy (float64), written from the equations.

It shares no code with llama_chat: weights come in Hugging Face names with separate
q/k/v and gate/up matrices, K/V heads are repeated explicitly, rotary angles are
computed per position, and attention is masked by hand. Used as a test oracle.
"""

import numpy as np


def rms_norm(x, gain, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gain


def rotate(x, positions, theta):
    """Rotate [time, heads, head_dim] in the half-split layout: pair i with i + head_dim/2."""
    half = x.shape[-1] // 2
    freqs = theta ** (-np.arange(half) * 2.0 / x.shape[-1])
    angles = positions[:, None] * freqs[None, :]  # [time, half]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def forward(weights, config, ids):
    """Logits [len(ids), vocab] for a model without rope scaling."""
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    n_heads, n_kv, head_dim = config["n_heads"], config["n_kv_heads"], config["head_dim"]
    eps, theta = config["norm_eps"], config["rope_theta"]
    time = len(ids)
    positions = np.arange(time, dtype=np.float64)
    future = np.triu(np.ones((time, time), dtype=bool), k=1)
    x = w["model.embed_tokens.weight"][ids]
    for layer in range(config["n_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(time, n_heads, head_dim)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(time, n_kv, head_dim)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(time, n_kv, head_dim)
        q, k = rotate(q, positions, theta), rotate(k, positions, theta)
        k = np.repeat(k, n_heads // n_kv, axis=1)
        v = np.repeat(v, n_heads // n_kv, axis=1)
        heads = []
        for head in range(n_heads):
            scores = q[:, head] @ k[:, head].T / np.sqrt(head_dim)
            scores[future] = -np.inf
            heads.append(softmax(scores) @ v[:, head])
        attention = np.concatenate(heads, axis=-1)
        x = x + attention @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T
