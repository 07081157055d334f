#!/usr/bin/python3
"""Checks a Hugging Face export (tools/ckpt export --format hf) from the
outside: reads model.safetensors with a reader of its own (an 8-byte length,
a JSON header, raw little-endian data: struct, json and numpy only), takes
the architecture from config.json alone, and runs the forward pass as the HF
model code defines it (Llama: rotate_half rope on halves of each head;
DeepSeek-V2/V3: MLA with the rope dims de-interleaved before rotate_half, the
V2 softmax "greedy" or the V3 sigmoid "noaux_tc" router with its correction
bias), in float64, written here from those definitions and sharing no code
with xuanxue or tools/torch_reference.py.

It also maps the HF names back to ours (undoing the rope permutation of
Llama's q and k rows and the order of V3's eh_proj inputs) and runs
tools/torch_reference.py's model on them, with the architecture read from
config.json: a second, independent route to the same loss.

Both recompute the run's last validation loss: the same windows of the byte
corpus the trainer evaluated (docs/DATA.md: window w of seq+1 tokens at
w*seq; batch j of rank r takes validation windows ((j*W + r)*B + b) mod V),
and compares with val_loss of the last metrics.jsonl record.

usage: hf_check.py HF_DIR CORPUS METRICS_JSONL --batch B --world W --eval-batches K --valid F
exit 0 when both |loss - val_loss| <= 1e-5 * |val_loss|, 1 otherwise.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        begin, end = info["data_offsets"]
        a = np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"])
        out[name] = torch.from_numpy(a.astype(np.float64))
    return out


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def cos_sin(dim, T, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def attend(q, k, v, scale):
    """q, k (B, H, T, Dq), v (B, H, T, Dv): causal softmax attention."""
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return s.softmax(-1) @ v


def mlp(W, p, x):
    return F.linear(F.silu(F.linear(x, W[p + "gate_proj.weight"])) * F.linear(x, W[p + "up_proj.weight"]),
                    W[p + "down_proj.weight"])


def llama_attention(cfg, W, p, x):
    B, T, C = x.shape
    H = cfg["num_attention_heads"]
    D = C // H
    q = F.linear(x, W[p + "q_proj.weight"]).view(B, T, H, D).transpose(1, 2)
    k = F.linear(x, W[p + "k_proj.weight"]).view(B, T, H, D).transpose(1, 2)
    v = F.linear(x, W[p + "v_proj.weight"]).view(B, T, H, D).transpose(1, 2)
    cos, sin = cos_sin(D, T, cfg["rope_theta"])
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    o = attend(q, k, v, D ** -0.5).transpose(1, 2).reshape(B, T, C)
    return F.linear(o, W[p + "o_proj.weight"])


def mla_attention(cfg, W, p, x):
    B, T, C = x.shape
    H, N, P, Dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    R, eps = cfg["kv_lora_rank"], cfg["rms_norm_eps"]
    if cfg["q_lora_rank"]:
        q = F.linear(rms(F.linear(x, W[p + "q_a_proj.weight"]), W[p + "q_a_layernorm.weight"], eps),
                     W[p + "q_b_proj.weight"])
    else:
        q = F.linear(x, W[p + "q_proj.weight"])
    q = q.view(B, T, H, N + P).transpose(1, 2)
    q_nope, q_pe = q[..., :N], q[..., N:]
    ckv = F.linear(x, W[p + "kv_a_proj_with_mqa.weight"])
    compressed, k_pe = ckv[..., :R], ckv[..., R:].view(B, T, 1, P).transpose(1, 2)
    kv = F.linear(rms(compressed, W[p + "kv_a_layernorm.weight"], eps), W[p + "kv_b_proj.weight"])
    kv = kv.view(B, T, H, N + Dv).transpose(1, 2)
    k_nope, value = kv[..., :N], kv[..., N:]
    cos, sin = cos_sin(P, T, cfg["rope_theta"])

    def rope(t):  # the HF DeepSeek code: de-interleave, then rotate_half
        b, h, s, d = t.shape
        t = t.reshape(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
        return t * cos + rotate_half(t) * sin

    q_pe, k_pe = rope(q_pe), rope(k_pe)
    query = torch.cat([q_nope, q_pe], -1)
    key = torch.cat([k_nope, k_pe.expand(B, H, T, P)], -1)
    o = attend(query, key, value, (N + P) ** -0.5).transpose(1, 2).reshape(B, T, H * Dv)
    return F.linear(o, W[p + "o_proj.weight"])


def moe(cfg, W, p, x):
    B, T, C = x.shape
    h = x.reshape(-1, C)
    logits = F.linear(h, W[p + "gate.weight"])
    K = cfg["num_experts_per_tok"]
    if cfg["scoring_func"] == "softmax":  # V2, topk_method greedy
        scores = logits.softmax(-1)
        weight, idx = torch.topk(scores, K, dim=-1)
    else:  # V3, topk_method noaux_tc (n_group = topk_group = 1: no group limit)
        assert cfg["n_group"] == 1 and cfg["topk_group"] == 1
        scores = logits.sigmoid()
        _, idx = torch.topk(scores + W[p + "gate.e_score_correction_bias"], K, dim=-1)
        weight = scores.gather(1, idx)
    normalize = K > 1 and cfg["norm_topk_prob"]
    if normalize:
        weight = weight / (weight.sum(-1, keepdim=True) + 1e-20)
    if cfg["model_type"] == "deepseek_v3" or not normalize:  # V2 scales only weights it does not normalise
        weight = weight * cfg["routed_scaling_factor"]
    y = torch.zeros_like(h)
    for e in range(cfg["n_routed_experts"]):
        rows, slot = (idx == e).nonzero(as_tuple=True)
        if rows.numel():
            y[rows] += weight[rows, slot, None] * mlp(W, p + f"experts.{e}.", h[rows])
    if cfg.get("n_shared_experts"):
        y = y + mlp(W, p + "shared_experts.", h)
    return y.view(B, T, C)


def forward(cfg, W, tokens):
    """Logits (B, T, V) of the main model (DeepSeek-V3's MTP layers are not part of it)."""
    eps = cfg["rms_norm_eps"]
    deepseek = cfg["model_type"].startswith("deepseek")
    x = W["model.embed_tokens.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"], eps)
        x = x + (mla_attention if deepseek else llama_attention)(cfg, W, p + "self_attn.", h)
        h = rms(x, W[p + "post_attention_layernorm.weight"], eps)
        routed = deepseek and cfg.get("n_routed_experts") and l >= cfg["first_k_dense_replace"] \
            and l % cfg["moe_layer_freq"] == 0
        x = x + (moe(cfg, W, p + "mlp.", h) if routed else mlp(W, p + "mlp.", h))
    return F.linear(rms(x, W["model.norm.weight"], eps), W["lm_head.weight"])


# ----------------------------------------------------------------------------
# back to our names, into tools/torch_reference.py


def reference_config(cfg):
    """tools/torch_reference.py's architecture dict, from config.json."""
    deepseek = cfg["model_type"].startswith("deepseek")
    r = {"kind": "deepseek" if deepseek else "dense", "vocab": cfg["vocab_size"], "dim": cfg["hidden_size"],
         "layers": cfg["num_hidden_layers"], "heads": cfg["num_attention_heads"], "ffn": cfg["intermediate_size"],
         "seq": cfg["max_position_embeddings"], "rope_theta": cfg["rope_theta"], "norm_eps": cfg["rms_norm_eps"],
         "attention": {"kind": "mha"}, "moe": {"mode": "off"},
         "mtp": {"depth": cfg.get("num_nextn_predict_layers", 0), "weight": 0.0}}
    if deepseek:
        r["attention"] = {"kind": "mla", "kv_lora_rank": cfg["kv_lora_rank"], "q_lora_rank": cfg["q_lora_rank"] or 0,
                          "qk_nope_dim": cfg["qk_nope_head_dim"], "rope_dim": cfg["qk_rope_head_dim"],
                          "v_dim": cfg["v_head_dim"]}
        if cfg.get("n_routed_experts"):
            v3 = cfg["scoring_func"] == "sigmoid"
            r["moe"] = {"mode": "on", "dense_layers": cfg["first_k_dense_replace"],
                        "shared": cfg.get("n_shared_experts") or 0, "routed": cfg["n_routed_experts"],
                        "topk": cfg["num_experts_per_tok"], "ffn": cfg["moe_intermediate_size"],
                        "gate": "sigmoid" if v3 else "softmax", "balance": "bias" if v3 else "aux",
                        "balance_coef": 0.0, "route_scale": cfg["routed_scaling_factor"]}
    return r


def our_names(cfg, W):
    """(params, buffers) under our names from the HF tensors."""
    deepseek = cfg["model_type"].startswith("deepseek")
    H, L = cfg["num_attention_heads"], cfg["num_hidden_layers"]
    p = {"embed": W["model.embed_tokens.weight"], "norm": W["model.norm.weight"], "head": W["lm_head.weight"]}
    buffers = {}

    def interleaved(w):  # HF Llama's halves (i, i + D/2) back to our pairs (2i, 2i+1)
        d = w.shape[0] // H
        return w.reshape(H, 2, d // 2, -1).transpose(1, 2).reshape(w.shape)

    def block(hf, ours):
        p[ours + "attn_norm"] = W[hf + "input_layernorm.weight"]
        p[ours + "ffn_norm"] = W[hf + "post_attention_layernorm.weight"]
        a = hf + "self_attn."
        if not deepseek:
            p[ours + "attn.wq"] = interleaved(W[a + "q_proj.weight"])
            p[ours + "attn.wk"] = interleaved(W[a + "k_proj.weight"])
            p[ours + "attn.wv"] = W[a + "v_proj.weight"]
        else:
            for theirs, mine in (("q_proj", "wq"), ("q_a_proj", "wq_a"), ("q_a_layernorm", "q_norm"),
                                 ("q_b_proj", "wq_b"), ("kv_a_proj_with_mqa", "wkv_a"),
                                 ("kv_a_layernorm", "kv_norm"), ("kv_b_proj", "wkv_b")):
                if a + theirs + ".weight" in W:
                    p[ours + "attn." + mine] = W[a + theirs + ".weight"]
        p[ours + "attn.wo"] = W[a + "o_proj.weight"]
        m = hf + "mlp."
        names = (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2"))
        if m + "gate.weight" not in W:
            for theirs, mine in names:
                p[ours + "ffn." + mine] = W[m + theirs + ".weight"]
            return
        p[ours + "ffn.gate"] = W[m + "gate.weight"]
        if m + "gate.e_score_correction_bias" in W:
            buffers[ours + "ffn.gate_bias"] = W[m + "gate.e_score_correction_bias"]
        for theirs, mine in names:
            if m + f"shared_experts.{theirs}.weight" in W:
                p[ours + "ffn.shared." + mine] = W[m + f"shared_experts.{theirs}.weight"]
            for e in range(cfg["n_routed_experts"]):
                p[ours + f"ffn.experts.{e}." + mine] = W[m + f"experts.{e}.{theirs}.weight"]

    for l in range(L):
        block(f"model.layers.{l}.", f"layers.{l}.")
    for d in range(cfg.get("num_nextn_predict_layers", 0)):
        hf, ours = f"model.layers.{L + d}.", f"mtp.{d}."
        block(hf, ours)
        C = cfg["hidden_size"]
        eh = W[hf + "eh_proj.weight"]  # reads [enorm(embedding) | hnorm(hidden)]; ours [hidden | embedding]
        p[ours + "proj"] = torch.cat([eh[:, C:], eh[:, :C]], 1)
        p[ours + "enorm"], p[ours + "hnorm"] = W[hf + "enorm.weight"], W[hf + "hnorm.weight"]
        p[ours + "norm"] = W[hf + "shared_head.norm.weight"]
    return p, buffers


def reference_loss(cfg, W, inputs, targets):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "tools"))
    import torch_reference
    p, buffers = our_names(cfg, W)
    _, parts = torch_reference.loss_fn(p, buffers, reference_config(cfg), inputs, targets, {})
    return parts["main"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("corpus")
    ap.add_argument("metrics")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--eval-batches", type=int, required=True)
    ap.add_argument("--valid", type=float, required=True)
    args = ap.parse_args()
    cfg = json.load(open(f"{args.hf_dir}/config.json"))
    W = read_safetensors(f"{args.hf_dir}/model.safetensors")
    T = cfg["max_position_embeddings"]
    data = np.frombuffer(open(args.corpus, "rb").read(), dtype=np.uint8).astype(np.int64)
    total = (len(data) - 1) // T
    valid = max(1, int(math.floor(total * args.valid + 0.5)))
    train = total - valid
    losses, reference = [], []
    with torch.no_grad():
        for j in range(args.eval_batches):
            for r in range(args.world):
                w = [train + ((j * args.world + r) * args.batch + b) % valid for b in range(args.batch)]
                win = torch.tensor(np.stack([data[x * T:x * T + T + 1] for x in w]))
                logits = forward(cfg, W, win[:, :-1])
                losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), win[:, 1:].reshape(-1)).item())
                reference.append(reference_loss(cfg, W, win[:, :-1], win[:, 1:]))
    want = [json.loads(line) for line in open(args.metrics) if '"val_loss"' in line][-1]["val_loss"]
    ok = True
    for what, values in (("HF-convention forward", losses), ("tools/torch_reference.py by our names", reference)):
        got = sum(values) / len(values)
        rel = abs(got - want) / abs(want)
        ok &= rel <= 1e-5
        print(f"hf_check: {cfg['model_type']}: {what} {got:.8f}, the run's val_loss {want:.8f}, "
              f"relative {rel:.1e} -> {'OK' if rel <= 1e-5 else 'FAILED'} (bound 1e-5)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
