#!/usr/bin/env python3
"""An independent NumPy (float64) transcription of transformers' DeepSeek-V3 forward pass
(models/deepseek_v3/modeling_deepseek_v3.py, eager attention, and modeling_rope_utils' YaRN),
used to produce the reference logits the engine's tests compare against.

It reads a model folder written by `kdtree-engine make-tiny` (config.json, safetensors shards,
optionally INT4 experts in compressed-tensors pack-quantized form, unpacked here from the bit
layout directly) and prints the logits of a prompt as JSON.

    python3 deepseek_v3_numpy.py MODEL_DIR 3,141,59 > logits.json

With --greedy NEW, it decodes NEW tokens greedily instead (argmax of each forward's last logits, the
whole sequence recomputed each step, as transformers' generate without a cache) and prints the
tokens with the smallest gap between the first and second logit seen at any step, a measure of how
close to a tie the reference's choices came:

    python3 deepseek_v3_numpy.py --greedy 12 MODEL_DIR 3,141,59 > greedy.json
"""

import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        shape = info["shape"]
        dt = info["dtype"]
        if dt == "BF16":
            v = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            v = np.frombuffer(raw, dtype="<f2")
        elif dt == "F32":
            v = np.frombuffer(raw, dtype="<f4")
        elif dt == "I32":
            v = np.frombuffer(raw, dtype="<i4")
        elif dt == "I64":
            v = np.frombuffer(raw, dtype="<i8")
        else:
            raise ValueError(f"{name}: dtype {dt}")
        out[name] = v.reshape(shape)
    return out


def load(folder):
    tensors = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            tensors.update(read_safetensors(os.path.join(folder, name)))
    # compressed-tensors pack-quantized: 8 values per int32 along K, value j at bits 4j, stored q + 8.
    for packed_name in [n for n in tensors if n.endswith(".weight_packed")]:
        module = packed_name[: -len(".weight_packed")]
        packed = tensors.pop(packed_name).astype(np.int64) & 0xFFFFFFFF
        scale = tensors.pop(module + ".weight_scale").astype(np.float64)
        n, k = (int(x) for x in tensors.pop(module + ".weight_shape"))
        q = np.stack([(packed >> (4 * j)) & 0xF for j in range(8)], axis=-1).reshape(n, -1)[:, :k] - 8
        group = k // scale.shape[1]
        tensors[module + ".weight"] = q * np.repeat(scale, group, axis=1)
    return {k: v.astype(np.float64) for k, v in tensors.items()}


def rmsnorm(x, w, eps):
    return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def silu(x):
    return x / (1 + np.exp(-x))


def mlp(w, p, x):
    return silu(x @ w[p + ".gate_proj.weight"].T) * (x @ w[p + ".up_proj.weight"].T) @ w[p + ".down_proj.weight"].T


def get_mscale(scale, mscale=1):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_tables(c, positions):
    dim, base = c["qk_rope_head_dim"], c.get("rope_theta", 10000.0)
    pos_freqs = base ** (np.arange(0, dim, 2) / dim)
    inv_freq, attention_factor = 1.0 / pos_freqs, 1.0
    rs = c.get("rope_scaling")
    if rs and rs.get("type", rs.get("rope_type")) == "yarn":
        factor = rs["factor"]
        mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1
        omax = rs["original_max_position_embeddings"]

        def corr(rot):
            return (dim * math.log(omax / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
        extra = 1 - ramp
        inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    freqs = np.outer(positions, inv_freq)
    emb = np.concatenate([freqs, freqs], -1)
    return np.cos(emb) * attention_factor, np.sin(emb) * attention_factor


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def rope_interleave(x, cos, sin):
    # view(d // 2, 2).transpose -> [evens, odds], then rotate_half.
    x = np.concatenate([x[..., 0::2], x[..., 1::2]], -1)
    return x * cos + rotate_half(x) * sin


def attention(c, w, p, x, cos, sin):
    s, heads = x.shape[0], c["num_attention_heads"]
    nope, rope, vd, r = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    eps = c["rms_norm_eps"]
    if c.get("q_lora_rank") is None:
        q = x @ w[p + ".q_proj.weight"].T
    else:
        q = rmsnorm(x @ w[p + ".q_a_proj.weight"].T, w[p + ".q_a_layernorm.weight"], eps) @ w[p + ".q_b_proj.weight"].T
    q = q.reshape(s, heads, nope + rope).transpose(1, 0, 2)
    q_pass, q_rot = q[..., :nope], q[..., nope:]
    ckv = x @ w[p + ".kv_a_proj_with_mqa.weight"].T
    k_pass, k_rot = ckv[:, :r], ckv[:, r:]
    kv = (rmsnorm(k_pass, w[p + ".kv_a_layernorm.weight"], eps) @ w[p + ".kv_b_proj.weight"].T)
    kv = kv.reshape(s, heads, nope + vd).transpose(1, 0, 2)
    k_pass, v = kv[..., :nope], kv[..., nope:]
    rotate = rope_interleave if c.get("rope_interleave", True) else (lambda x, cos, sin: x * cos + rotate_half(x) * sin)
    q_rot = rotate(q_rot, cos, sin)
    k_rot = np.broadcast_to(rotate(k_rot[None], cos, sin), (heads, s, rope))
    query = np.concatenate([q_pass, q_rot], -1)
    key = np.concatenate([k_pass, k_rot], -1)
    scaling = (nope + rope) ** -0.5
    rs = c.get("rope_scaling")
    if rs and rs.get("mscale_all_dim"):
        m = get_mscale(rs["factor"], rs["mscale_all_dim"])
        scaling *= m * m
    scores = query @ key.transpose(0, 2, 1) * scaling
    scores = scores + np.triu(np.full((s, s), -np.inf), 1)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    out = (probs @ v).transpose(1, 0, 2).reshape(s, heads * vd)
    return out @ w[p + ".o_proj.weight"].T


def moe(c, w, p, x):
    e, k = c["n_routed_experts"], c["num_experts_per_tok"]
    n_group, topk_group = c["n_group"], c["topk_group"]
    scores = 1 / (1 + np.exp(-(x @ w[p + ".gate.weight"].T)))
    choice = scores + w[p + ".gate.e_score_correction_bias"][None]
    group_scores = np.sort(choice.reshape(-1, n_group, e // n_group), -1)[..., -2:].sum(-1)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        groups = np.argsort(-group_scores[t], kind="stable")[:topk_group]
        mask = np.zeros(e, bool)
        for g in groups:
            mask[g * (e // n_group) : (g + 1) * (e // n_group)] = True
        masked = np.where(mask, choice[t], 0.0)
        idx = np.argsort(-masked, kind="stable")[:k]
        weights = scores[t, idx]
        if c.get("norm_topk_prob", True):
            weights = weights / (weights.sum() + 1e-20)
        weights = weights * c["routed_scaling_factor"]
        for i, wt in zip(idx, weights):
            out[t] += mlp(w, f"{p}.experts.{i}", x[t : t + 1])[0] * wt
    return out + mlp(w, p + ".shared_experts", x)


def forward(folder, ids):
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    return forward_loaded(c, load(folder), ids)


def forward_loaded(c, w, ids):
    eps = c["rms_norm_eps"]
    cos, sin = rope_tables(c, np.arange(len(ids)))
    x = w["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        x = x + attention(c, w, p + ".self_attn", rmsnorm(x, w[p + ".input_layernorm.weight"], eps), cos, sin)
        h = rmsnorm(x, w[p + ".post_attention_layernorm.weight"], eps)
        x = x + (moe(c, w, p + ".mlp", h) if i >= c["first_k_dense_replace"] else mlp(w, p + ".mlp", h))
    return rmsnorm(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


def greedy(folder, prompt, new):
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    w = load(folder)
    ids, gap = list(prompt), math.inf
    for _ in range(new):
        last = forward_loaded(c, w, ids)[-1]
        top = np.sort(last)[-2:]
        gap = min(gap, float(top[1] - top[0]))
        ids.append(int(np.argmax(last)))
    return {"prompt": prompt, "tokens": ids[len(prompt) :], "min_top2_gap": gap}


if __name__ == "__main__":
    if sys.argv[1] == "--greedy":
        new, folder, prompt = int(sys.argv[2]), sys.argv[3], [int(t) for t in sys.argv[4].split(",")]
        print(json.dumps(greedy(folder, prompt, new)))
    else:
        folder, prompt = sys.argv[1], [int(t) for t in sys.argv[2].split(",")]
        print(json.dumps({"prompt": prompt, "logits": forward(folder, prompt).tolist()}))
