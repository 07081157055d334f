#!/usr/bin/python3
"""Independent check of `tools/ckpt export FILE --format hf OUT_DIR` (tests/cli/hf_export.sh).

Reads OUT_DIR/model.safetensors from the format's definition (struct, json, numpy: an 8-byte
little-endian header length N, N bytes of JSON naming each tensor's dtype, shape and
data_offsets counted from the byte after the header, then the raw little-endian data) and
OUT_DIR/config.json, without tools/ckpt, and checks on the validation windows the run's last
evaluation used (rebuilt here from the corpus, as src/train/trainer.cpp's evaluate() picks them):
  1. the HF tensors, mapped back to our names (undoing the documented permutations), equal the
     checkpoint's /model and /buffers bit for bit; config.json's keys give the deck's model;
  2. tools/torch_reference.py's loss (float64) from the mapped-back tensors and config.json equals
     its loss from the checkpoint's /model and the deck (total, main, mtp, aux; rel <= 1e-5);
  3. a forward written here from the Hugging Face model code's conventions (Llama: rotate_half;
     DeepSeek: the rope part de-interleaved, then rotate_half; YaRN from rope_scaling as DeepSeek's
     DeepseekV2YarnRotaryEmbedding and softmax_scale compute it (Llama: transformers' YaRN); latent
     norms with eps 1e-6, the others with rms_norm_eps; the gate from scoring_func, topk_method
     (V2's group_limited_greedy and V3's noaux_tc keep topk_group of n_group expert groups),
     norm_topk_prob, routed_scaling_factor, e_score_correction_bias; MoE layers by
     first_k_dense_replace and moe_layer_freq; the balance loss from aux_loss_alpha and seq_aux:
     DeepSeek-V2's MoEGate over the batch or per sequence, DeepSeek-V3's complementary
     sequence-wise loss (its paper, eq. 17-20) under seq_aux; MTP layers num_hidden_layers + d from
     eh_proj([enorm(emb), hnorm(h)])), on the HF names and config.json keys alone, gives the same
     main, MTP and balance losses (rel <= 1e-5);
  4. its main loss equals the trainer's own val_loss of the last step in metrics.jsonl (computed
     in float32 by the trainer from the same weights on the same windows; rel <= 1e-5);
  5. each convention matters here: the forward without it (Llama's rows not permuted, DeepSeek's
     rope not de-interleaved, the selection bias left out, eh_proj's halves not swapped, routing
     without groups where config.json has them, YaRN left out, a sequence-wise balance loss taken
     over the whole batch) misses.

usage: hf_read.py OUT_DIR CHECKPOINT.h5 METRICS.jsonl (--bytes CORPUS --valid F | --valid-shard FILE)
                  --batch B --eval-batches K [--expect-bias]
"""
import argparse
import json
import math
import os
import struct
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import torch_reference as ref  # noqa: E402  (the float64 reference the parity tests use)

RTOL = 1e-5
DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "F16": np.dtype("<f2"), "I64": np.dtype("<i8")}
failures = []


def check(ok, what):
    print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def rel(a, b):
    return abs(a - b) / abs(b) if b != 0 else abs(a - b)


# ----------------------------------------------------------------------------
# safetensors, from its definition


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    check(n % 8 == 0 and 8 + n <= len(raw), f"header of {n} bytes, a multiple of 8 (JSON padded with spaces)")
    meta = header.pop("__metadata__", {})
    check(meta.get("format") == "pt" and all(isinstance(v, str) for v in meta.values()),
          f"__metadata__ {meta} (format pt, string values)")
    tensors, spans = {}, []
    for name, d in header.items():
        dtype = DTYPES[d["dtype"]]
        begin, end = d["data_offsets"]
        shape = tuple(d["shape"])
        assert end - begin == math.prod(shape) * dtype.itemsize, f"{name}: {end - begin} bytes for shape {shape}"
        tensors[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape).astype(np.float32)
        spans.append((begin, end))
    spans.sort()
    covered = all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and spans[0][0] == 0 and spans[-1][1] == len(data)
    check(covered, f"{len(tensors)} tensors tile the {len(data)} data bytes without holes or overlaps")
    return tensors, meta


# ----------------------------------------------------------------------------
# HF names back to ours (docs/CHECKPOINT.md, "Export for other tools")


def halves_to_interleaved(w, heads):
    """Llama's per-head row order (i, i + D/2) back to our pairs (2i, 2i+1)."""
    rows, cols = w.shape
    d = rows // heads
    return w.reshape(heads, 2, d // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def to_ours(t, c):
    """{our name: array}, {our buffer: array} from the HF tensors t and config c."""
    llama = c["model_type"] == "llama"
    L, C, H = c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"]
    D = c.get("num_nextn_predict_layers", 0)
    p, b = {}, {}

    def is_moe(i):
        return c.get("n_routed_experts") is not None and i >= c["first_k_dense_replace"] and \
            i % c.get("moe_layer_freq", 1) == 0

    def block(hf, ours, i):
        p[ours + "attn_norm"] = t[hf + "input_layernorm.weight"]
        a = hf + "self_attn."
        if llama:
            p[ours + "attn.wq"] = halves_to_interleaved(t[a + "q_proj.weight"], H)
            p[ours + "attn.wk"] = halves_to_interleaved(t[a + "k_proj.weight"], H)
            p[ours + "attn.wv"] = t[a + "v_proj.weight"]
        else:
            if c["q_lora_rank"] is None:
                p[ours + "attn.wq"] = t[a + "q_proj.weight"]
            else:
                p[ours + "attn.wq_a"] = t[a + "q_a_proj.weight"]
                p[ours + "attn.q_norm"] = t[a + "q_a_layernorm.weight"]
                p[ours + "attn.wq_b"] = t[a + "q_b_proj.weight"]
            p[ours + "attn.wkv_a"] = t[a + "kv_a_proj_with_mqa.weight"]
            p[ours + "attn.kv_norm"] = t[a + "kv_a_layernorm.weight"]
            p[ours + "attn.wkv_b"] = t[a + "kv_b_proj.weight"]
        p[ours + "attn.wo"] = t[a + "o_proj.weight"]
        p[ours + "ffn_norm"] = t[hf + "post_attention_layernorm.weight"]
        m = hf + "mlp."
        parts = [("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")]
        if not is_moe(i):
            for h_name, o_name in parts:
                p[f"{ours}ffn.{o_name}"] = t[f"{m}{h_name}.weight"]
            return
        p[ours + "ffn.gate"] = t[m + "gate.weight"]
        if m + "gate.e_score_correction_bias" in t:
            b[ours + "ffn.gate_bias"] = t[m + "gate.e_score_correction_bias"]
        if c["n_shared_experts"]:
            for h_name, o_name in parts:
                p[f"{ours}ffn.shared.{o_name}"] = t[f"{m}shared_experts.{h_name}.weight"]
        for j in range(c["n_routed_experts"]):
            for h_name, o_name in parts:
                p[f"{ours}ffn.experts.{j}.{o_name}"] = t[f"{m}experts.{j}.{h_name}.weight"]

    p["embed"] = t["model.embed_tokens.weight"]
    for i in range(L):
        block(f"model.layers.{i}.", f"layers.{i}.", i)
    p["norm"] = t["model.norm.weight"]
    tied = c.get("tie_word_embeddings", False)  # transformers reads embed_tokens as the head; no lm_head
    if tied:
        check("lm_head.weight" not in t, "tie_word_embeddings true: no lm_head.weight, embed_tokens is the head")
    else:
        p["head"] = t["lm_head.weight"]
    head = p["embed"] if tied else p["head"]
    for d in range(D):
        hf, ours = f"model.layers.{L + d}.", f"mtp.{d}."
        check(np.array_equal(t[hf + "embed_tokens.weight"], p["embed"]) and
              np.array_equal(t[hf + "shared_head.head.weight"], head),
              f"{hf}embed_tokens and shared_head.head are the shared embedding and head")
        p[ours + "enorm"], p[ours + "hnorm"] = t[hf + "enorm.weight"], t[hf + "hnorm.weight"]
        eh = t[hf + "eh_proj.weight"]  # [enorm(emb) | hnorm(h)] -> ours [hnorm(h) | enorm(emb)]
        p[ours + "proj"] = np.concatenate([eh[:, C:], eh[:, :C]], axis=1)
        block(hf, ours, L + d)
        p[ours + "norm"] = t[hf + "shared_head.norm.weight"]
    return p, b


def reference_config(c, mtp_weight):
    """tools/torch_reference.py's configuration, from config.json's keys."""
    cfg = {"kind": None, "vocab": c["vocab_size"], "dim": c["hidden_size"], "layers": c["num_hidden_layers"],
           "heads": c["num_attention_heads"], "ffn": c["intermediate_size"], "seq": c["max_position_embeddings"],
           "rope_theta": c["rope_theta"], "norm_eps": c["rms_norm_eps"],
           "tie_embeddings": c.get("tie_word_embeddings", False)}
    if c["model_type"] == "llama":
        cfg["attention"] = {"kind": "mha"}
    else:
        cfg["attention"] = {"kind": "mla", "kv_lora_rank": c["kv_lora_rank"], "q_lora_rank": c["q_lora_rank"] or 0,
                            "qk_nope_dim": c["qk_nope_head_dim"], "rope_dim": c["qk_rope_head_dim"],
                            "v_dim": c["v_head_dim"], "latent_eps": 1e-6}  # HF's latent norms: always 1e-6
    y = yarn_of(c)
    cfg["rope_scaling"] = {"kind": "off"} if y is None else {
        "kind": "yarn", "factor": float(y["factor"]), "original_seq": int(y["original_max_position_embeddings"]),
        "beta_fast": float(y.get("beta_fast", 32)), "beta_slow": float(y.get("beta_slow", 1)),
        "mscale": float(y.get("mscale", 1)), "mscale_all_dim": float(y.get("mscale_all_dim", 0))}
    if c.get("n_routed_experts") is None:
        cfg["moe"] = {"mode": "off"}
    else:
        sigmoid = c["scoring_func"] == "sigmoid"
        alpha, seq_aux = c["aux_loss_alpha"], c.get("seq_aux", True)
        # softmax: V2's loss, per sequence under seq_aux; sigmoid: the bias, with the sequence-wise loss
        # beside it under seq_aux (a batch-level alpha without seq_aux is balance aux's, kept for reference)
        aux = not sigmoid or (alpha > 0 and not seq_aux)
        cfg["moe"] = {"mode": "on", "dense_layers": c["first_k_dense_replace"], "shared": c["n_shared_experts"],
                      "routed": c["n_routed_experts"], "topk": c["num_experts_per_tok"],
                      "ffn": c["moe_intermediate_size"], "gate": c["scoring_func"],
                      "balance": "aux" if aux else "bias", "balance_coef": alpha,
                      "aux_scope": "sequence" if aux and seq_aux else "batch",
                      "seq_aux": alpha if not aux and seq_aux else 0.0,
                      "route_scale": c["routed_scaling_factor"], "layer_freq": c.get("moe_layer_freq", 1)}
        # greedy ignores n_group and topk_group; group_limited_greedy and noaux_tc route inside them
        grouped = c["topk_method"] in ("group_limited_greedy", "noaux_tc")
        cfg["moe"].update(groups=c["n_group"] if grouped else 1, topk_groups=c["topk_group"] if grouped else 1)
    cfg["mtp"] = {"depth": c.get("num_nextn_predict_layers", 0), "weight": mtp_weight}
    return cfg


# ----------------------------------------------------------------------------
# a forward in the Hugging Face model code's conventions, on its names and keys alone


def hf_rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def yarn_of(c):
    """config.json's rope_scaling (or rope_parameters) when its type or rope_type is yarn, else None."""
    r = c.get("rope_scaling") or c.get("rope_parameters") or {}
    return r if "yarn" in (r.get("type"), r.get("rope_type")) else None


def get_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rotary(c, dim, yarn=True):
    """(inv_freq, the cos/sin factor, the softmax scale's factor) as the HF codes build them from config.json:
    the plain base^(-2i/dim), or YaRN. DeepSeek (DeepseekV2YarnRotaryEmbedding): freq_extra and freq_inter =
    freq_extra / factor blended by 1 - the linear ramp between the correction range's floor and ceil (clipped
    to [0, dim-1]), the tables times get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim), and the
    attention's softmax_scale times get_mscale(factor, mscale_all_dim)^2 where mscale_all_dim is set.
    Llama (transformers' _compute_yarn_parameters): the same frequencies, the tables times attention_factor
    (else that ratio when mscale and mscale_all_dim are both set, else get_mscale(factor)), no softmax factor."""
    base = c["rope_theta"]
    freq_extra = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    y = yarn_of(c) if yarn else None
    if y is None:
        return freq_extra, 1.0, 1.0
    factor, original = y["factor"], y["original_max_position_embeddings"]
    mscale, mscale_all_dim = y.get("mscale", 1), y.get("mscale_all_dim", 0)

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(y.get("beta_fast", 32))), 0)
    high = min(math.ceil(correction_dim(y.get("beta_slow", 1))), dim - 1)
    if low == high:
        high += 0.001
    mask = 1.0 - torch.clamp((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
    inv_freq = freq_extra / factor * (1 - mask) + freq_extra * mask
    if c["model_type"] == "llama":
        table = y.get("attention_factor") or (get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
                                              if mscale and mscale_all_dim else get_mscale(factor))
        return inv_freq, table, 1.0
    table = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
    return inv_freq, table, get_mscale(factor, mscale_all_dim) ** 2 if mscale_all_dim else 1.0


def cos_sin(T, inv_freq, table):
    emb = torch.cat([torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)] * 2, dim=-1)  # (T, dim)
    return emb.cos() * table, emb.sin() * table


def sdpa(q, k, v, scale):
    """q, k (B, H, T, dqk), v (B, H, T, dv) -> (B, T, H*dv), causal."""
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    o = torch.softmax(s, dim=-1) @ v
    return o.transpose(1, 2).reshape(q.shape[0], T, -1)


class HF:
    """Llama / DeepSeek-V2 / DeepSeek-V3 forward from config c and tensors w (HF names)."""

    def __init__(self, c, w, deinterleave=True, groups=True, yarn=True, one_sequence=False):
        self.c, self.w, self.deinterleave = c, {k: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}, deinterleave
        self.groups = groups  # False: route with a plain top-k over every expert (the check that groups matter)
        self.yarn = yarn
        self.one_sequence = one_sequence  # the sequence-wise balance loss over the batch as one sequence
        self.v3 = c["model_type"] == "deepseek_v3"
        self.stats = {"bias_changed": 0, "selections": 0}

    def linear(self, x, name):
        return x @ self.w[name + ".weight"].T

    def llama_attention(self, pre, x):
        c = self.c
        B, T, _ = x.shape
        H, Hk, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        q = self.linear(x, pre + "q_proj").view(B, T, H, hd).transpose(1, 2)
        k = self.linear(x, pre + "k_proj").view(B, T, Hk, hd).transpose(1, 2)
        v = self.linear(x, pre + "v_proj").view(B, T, Hk, hd).transpose(1, 2)
        inv_freq, table, gain = rotary(c, hd, self.yarn)
        cos, sin = cos_sin(T, inv_freq, table)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        return self.linear(sdpa(q, k, v, hd ** -0.5 * gain), pre + "o_proj")

    def deepseek_attention(self, pre, x):
        c = self.c
        B, T, _ = x.shape
        H, dn, dr, dv, R = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                            c["v_head_dim"], c["kv_lora_rank"])
        if c["q_lora_rank"] is None:
            q = self.linear(x, pre + "q_proj")
        else:  # the latent norms: RMSNorm(rank) with its default eps 1e-6
            q = self.linear(hf_rmsnorm(self.linear(x, pre + "q_a_proj"), self.w[pre + "q_a_layernorm.weight"], 1e-6),
                            pre + "q_b_proj")
        q = q.view(B, T, H, dn + dr).transpose(1, 2)
        q_pass, q_rot = q[..., :dn], q[..., dn:]
        ckv = self.linear(x, pre + "kv_a_proj_with_mqa")
        k_pass, k_rot = ckv[..., :R], ckv[..., R:]
        kv = self.linear(hf_rmsnorm(k_pass, self.w[pre + "kv_a_layernorm.weight"], 1e-6), pre + "kv_b_proj")
        kv = kv.view(B, T, H, dn + dv).transpose(1, 2)
        k_pass, v = kv[..., :dn], kv[..., dn:]
        k_rot = k_rot.view(B, 1, T, dr)
        if self.deinterleave:  # apply_rotary_pos_emb(_interleave): pairs (2i, 2i+1) to halves, then rotate_half
            q_rot = q_rot.reshape(B, H, T, dr // 2, 2).transpose(4, 3).reshape(B, H, T, dr)
            k_rot = k_rot.reshape(B, 1, T, dr // 2, 2).transpose(4, 3).reshape(B, 1, T, dr)
        inv_freq, table, gain = rotary(c, dr, self.yarn)
        cos, sin = cos_sin(T, inv_freq, table)
        q_rot, k_rot = q_rot * cos + rotate_half(q_rot) * sin, k_rot * cos + rotate_half(k_rot) * sin
        q = torch.cat([q_pass, q_rot], dim=-1)
        k = torch.cat([k_pass, k_rot.expand(B, H, T, dr)], dim=-1)
        return self.linear(sdpa(q, k, v, (dn + dr) ** -0.5 * gain), pre + "o_proj")

    def mlp(self, pre, x):
        return self.linear(F.silu(self.linear(x, pre + "gate_proj")) * self.linear(x, pre + "up_proj"),
                           pre + "down_proj")

    def kept_groups(self, choice, value):
        """(N, E) True for the experts of each row's topk_group best groups: the experts in n_group groups
        of E / n_group, in order; value: a group's value from its (N, n_group, E / n_group) choices."""
        c = self.c
        G, E = c["n_group"], choice.shape[-1]
        group = value(choice.view(-1, G, E // G))
        keep = torch.zeros_like(group).scatter_(1, torch.topk(group, k=c["topk_group"], dim=-1)[1], 1)
        return keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()

    def moe(self, pre, x):
        """DeepseekV2MoE / DeepseekV3MoE; returns (out, the balance loss)."""
        c = self.c
        B, T, C = x.shape
        h = x.reshape(B * T, C)
        E, k = c["n_routed_experts"], c["num_experts_per_tok"]
        logits = h @ self.w[pre + "gate.weight"].T
        if c["scoring_func"] == "softmax":
            scores = logits.softmax(dim=-1)
        else:
            scores = logits.sigmoid()
        if c["topk_method"] == "greedy" or (c["topk_method"] == "group_limited_greedy" and not self.groups):
            weight, idx = torch.topk(scores, k=k, dim=-1)
        elif c["topk_method"] == "group_limited_greedy":  # V2: a group's value is its largest score
            mask = self.kept_groups(scores, lambda group: group.max(dim=-1).values)
            weight, idx = torch.topk(scores.masked_fill(~mask, 0.0), k=k, dim=-1)
        elif c["topk_method"] == "noaux_tc":  # V3: groups by the sum of their two largest score + bias
            def select(choice):
                if not self.groups:
                    return torch.topk(choice, k=k, dim=-1)[1]
                mask = self.kept_groups(choice, lambda group: group.topk(2, dim=-1)[0].sum(-1))
                return torch.topk(choice.masked_fill(~mask, float("-inf")), k=k, dim=-1)[1]
            idx = select(scores + self.w[pre + "gate.e_score_correction_bias"].unsqueeze(0))
            weight = scores.gather(1, idx)
            plain = select(scores)  # the same routing without the bias
            self.stats["bias_changed"] += int((plain.sort(-1).values != idx.sort(-1).values).any(-1).sum())
            self.stats["selections"] += idx.shape[0]
        else:
            raise SystemExit(f"topk_method {c['topk_method']}")
        if self.v3:
            if c["norm_topk_prob"]:
                weight = weight / (weight.sum(-1, keepdim=True) + 1e-20)
            weight = weight * c["routed_scaling_factor"]
        elif k > 1 and c["norm_topk_prob"]:
            weight = weight / (weight.sum(-1, keepdim=True) + 1e-20)
        else:
            weight = weight * c["routed_scaling_factor"]
        out = torch.zeros_like(h)
        for j in range(E):
            token, slot = torch.where(idx == j)
            if token.numel():
                out[token] += weight[token, slot].unsqueeze(-1) * self.mlp(f"{pre}experts.{j}.", h[token])
        out = out + self.mlp(pre + "shared_experts.", h)
        aux = torch.zeros((), dtype=h.dtype)
        alpha, seq_aux = c.get("aux_loss_alpha", 0), c.get("seq_aux", True)
        if alpha > 0 and not seq_aux:  # DeepSeek-V2's MoEGate, seq_aux off: the whole batch
            ce = F.one_hot(idx.reshape(-1), num_classes=E).to(h.dtype).mean(0)
            aux = (scores.mean(0) * ce * E).sum() * alpha
        elif alpha > 0 and not self.v3:  # DeepSeek-V2's MoEGate, seq_aux on: each sequence, then their mean
            Bs, Ts = (1, B * T) if self.one_sequence else (B, T)
            hits = torch.zeros(Bs, E, dtype=h.dtype).scatter_add(1, idx.view(Bs, Ts * k),
                                                                   torch.ones(Bs, Ts * k, dtype=h.dtype))
            ce = hits / (Ts * k / E)
            aux = (ce * scores.view(Bs, Ts, E).mean(1)).sum(1).mean() * alpha
        elif alpha > 0:  # DeepSeek-V3's complementary sequence-wise loss: the paper's eq. 17-20
            Bs, Ts = (1, B * T) if self.one_sequence else (B, T)
            share = scores / scores.sum(-1, keepdim=True)  # s' over all routed experts
            P = share.view(Bs, Ts, E).mean(1)
            f = F.one_hot(idx.view(Bs, Ts * k), num_classes=E).to(h.dtype).sum(1) * E / (k * Ts)
            aux = alpha * (f * P).sum(1).mean()
        return out.view(B, T, C), aux

    def layer(self, i, x):
        c, pre = self.c, f"model.layers.{i}."
        eps = c["rms_norm_eps"]
        attn = self.llama_attention if c["model_type"] == "llama" else self.deepseek_attention
        x = x + attn(pre + "self_attn.", hf_rmsnorm(x, self.w[pre + "input_layernorm.weight"], eps))
        h = hf_rmsnorm(x, self.w[pre + "post_attention_layernorm.weight"], eps)
        moe = c.get("n_routed_experts") is not None and i >= c["first_k_dense_replace"] and \
            i % c.get("moe_layer_freq", 1) == 0
        if moe:
            y, aux = self.moe(pre + "mlp.", h)
        else:
            y, aux = self.mlp(pre + "mlp.", h), torch.zeros((), dtype=h.dtype)
        return x + y, aux

    def trunk(self, inputs):
        """The main model: (logits (B, T, V), the last hidden state before model.norm, the summed aux loss)."""
        c, w = self.c, self.w
        x = w["model.embed_tokens.weight"][inputs]
        aux = torch.zeros((), dtype=torch.float64)
        for i in range(c["num_hidden_layers"]):
            x, a = self.layer(i, x)
            aux = aux + a
        # tie_word_embeddings: transformers' tie_weights makes lm_head the embedding's own tensor
        head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
        return hf_rmsnorm(x, w["model.norm.weight"], c["rms_norm_eps"]) @ head.T, x, aux

    def losses(self, inputs, targets):
        """(main, mtp mean over depths, aux); MTP as DeepSeek-V3 defines it: depth d at position t
        combines the previous depth's hidden state (the main model's, before model.norm, at d = 0)
        with the embedding of token t+d+1 and predicts token t+d+2."""
        c, w = self.c, self.w
        B, T = inputs.shape
        L, V, eps = c["num_hidden_layers"], c["vocab_size"], c["rms_norm_eps"]
        logits, x, aux = self.trunk(inputs)
        main = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
        self.accuracy = (logits.argmax(-1) == targets).double().mean().item()  # next-token accuracy
        D = c.get("num_nextn_predict_layers", 0)
        mtp, h = torch.zeros((), dtype=torch.float64), x
        for d in range(D):
            pre = f"model.layers.{L + d}."
            tok = torch.zeros_like(targets)
            tok[:, :T - d] = targets[:, d:]
            label = torch.full_like(targets, -100)
            label[:, :T - d - 1] = targets[:, d + 1:]
            e = hf_rmsnorm(w[pre + "embed_tokens.weight"][tok], w[pre + "enorm.weight"], eps)
            h = torch.cat([e, hf_rmsnorm(h, w[pre + "hnorm.weight"], eps)], dim=-1) @ w[pre + "eh_proj.weight"].T
            h, a = self.layer(L + d, h)
            aux = aux + a
            lg = hf_rmsnorm(h, w[pre + "shared_head.norm.weight"], eps) @ w[pre + "shared_head.head.weight"].T
            mtp = mtp + F.cross_entropy(lg.reshape(-1, V), label.reshape(-1), ignore_index=-100)
        return main.item(), (mtp / D).item() if D else 0.0, aux.item()


# ----------------------------------------------------------------------------
# the last evaluation's windows (src/train/trainer.cpp evaluate(), one rank)


def read_tokens(args):
    if args.bytes:
        return np.frombuffer(open(args.bytes, "rb").read(), dtype=np.uint8).astype(np.int64), args.valid
    raw = open(args.valid_shard, "rb").read()
    magic, version, width = struct.unpack("<8sII", raw[:16])
    assert magic == b"XXTOKENS", "not a token shard"
    header = 64 if version >= 2 else 32
    return np.frombuffer(raw[header:], dtype={2: "<u2", 4: "<u4"}[width]).astype(np.int64), None


def validation_batch(args, seq):
    """All K*B validation windows of the last evaluation: (inputs, targets) (K*B, seq)."""
    tokens, fraction = read_tokens(args)
    total = (tokens.size - 1) // seq
    if fraction is None:  # a validation file: all its windows
        first, valid = 0, total
    else:
        valid = max(1, int(math.floor(total * fraction + 0.5)))
        first = total - valid
    rows = []
    for j in range(args.eval_batches):
        for b in range(args.batch):
            w = first + (j * args.batch + b) % valid  # world 1, rank 0
            rows.append(tokens[w * seq:w * seq + seq + 1])
    rows = torch.tensor(np.stack(rows), dtype=torch.long)
    return rows[:, :-1], rows[:, 1:]


# ----------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("checkpoint")
    p.add_argument("metrics")
    p.add_argument("--bytes")
    p.add_argument("--valid", type=float)
    p.add_argument("--valid-shard")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--eval-batches", type=int, required=True)
    p.add_argument("--expect-bias", action="store_true", help="the selection bias must change a choice")
    p.add_argument("--logits", help="xuanxue generate -logits FILE of this checkpoint: the same logits here")
    args = p.parse_args()
    torch.set_num_threads(1)

    print(f"# {args.out_dir}")
    tensors, meta = read_safetensors(os.path.join(args.out_dir, "model.safetensors"))
    c = json.load(open(os.path.join(args.out_dir, "config.json")))
    print(f"# {c['architectures'][0]} ({c['model_type']}), {len(tensors)} tensors")
    with h5py.File(args.checkpoint, "r") as f:
        deck = ref.checkpoint_deck(f)
        model = {name: f["model"][name][()] for name in f["model"]}
        buffers = {name: f["buffers"][name][()] for name in f["buffers"]} if "buffers" in f else {}

    # 1. back to our names, bit for bit; config.json gives the deck's model
    ours, our_buffers = to_ours(tensors, c)
    same = set(ours) == set(model) and all(np.array_equal(ours[k].view(np.uint32), model[k].view(np.uint32))
                                          for k in model)
    check(same, f"the {len(ours)} tensors mapped back equal /model bit for bit")
    biases = {k: v for k, v in buffers.items() if k.endswith("ffn.gate_bias")}
    if c["model_type"] == "deepseek_v3" and c.get("n_routed_experts"):
        check(all(np.array_equal(our_buffers[k], biases.get(k, np.zeros_like(our_buffers[k]))) for k in our_buffers)
              and set(biases) <= set(our_buffers), f"e_score_correction_bias equals /buffers/*.gate_bias "
                                                   f"({len(our_buffers)} layers)")
    deck_cfg, _ = ref.model_config(deck)
    cfg = reference_config(c, deck_cfg["mtp"]["weight"])
    cfg["kind"] = deck_cfg["kind"]
    if cfg["moe"]["mode"] == "on" and cfg["moe"]["balance"] == "bias":  # the bias's update step: training only
        cfg["moe"]["balance_coef"] = deck_cfg["moe"]["balance_coef"]
    same_cfg = json.dumps(cfg, sort_keys=True) == json.dumps(deck_cfg, sort_keys=True)
    check(same_cfg, "config.json's keys give the deck's model" + ("" if same_cfg else f": {cfg} vs {deck_cfg}"))

    inputs, targets = validation_batch(args, c["max_position_embeddings"])
    print(f"# batch: the last evaluation's {inputs.shape[0]} validation windows of {inputs.shape[1]} tokens")

    # 2. tools/torch_reference.py from the checkpoint, and from the export
    def reference(params, bufs, config):
        with torch.no_grad():
            t = {k: torch.tensor(v, dtype=torch.float64) for k, v in params.items()}
            b = {k: torch.tensor(v, dtype=torch.float64) for k, v in bufs.items()}
            total, parts = ref.loss_fn(t, b, config, inputs, targets, {})
        return {"total": total.item(), **parts}

    from_h5 = reference(model, buffers, deck_cfg)
    from_hf = reference(ours, our_buffers, cfg)
    for part in ("total", "main", "mtp", "aux"):
        check(rel(from_hf[part], from_h5[part]) <= RTOL,
              f"torch_reference {part:<5} from the export {from_hf[part]:.10f}, from /model {from_h5[part]:.10f}")

    # 3. the HF-convention forward
    with torch.no_grad():
        hf = HF(c, tensors)
        main, mtp, aux = hf.losses(inputs, targets)
    for part, value in (("main", main), ("mtp", mtp), ("aux", aux)):
        check(rel(value, from_h5[part]) <= RTOL or abs(value - from_h5[part]) < 1e-12,
              f"HF-convention forward {part:<4} {value:.10f}, torch_reference {from_h5[part]:.10f} "
              f"(rel {rel(value, from_h5[part]):.1e})")

    # 4. the trainer's own val_loss at its last step, on these windows, from these weights
    record = [json.loads(line) for line in open(args.metrics) if '"val_loss"' in line][-1]
    step = int(h5py.File(args.checkpoint, "r")["train"].attrs["step"])
    check(record["step"] == step, f"metrics' last val_loss is at step {record['step']}, the checkpoint's step {step}")
    check(rel(main, record["val_loss"]) <= RTOL,
          f"trainer's val_loss {record['val_loss']:.10f} (float32), HF-convention main loss {main:.10f} "
          f"(rel {rel(main, record['val_loss']):.1e})")
    # the trainer's next-token accuracy: the same argmax, but for at most one near-tie float32 may break
    # the other way
    tokens = targets.numel()
    check(abs(hf.accuracy - record["val_acc"]) <= 1.0 / tokens + 1e-12,
          f"trainer's val_acc {record['val_acc']:.6f}, HF-convention argmax {hf.accuracy:.6f} ({tokens} tokens)")

    # 4b. the decoder's logits (xuanxue generate -logits, the KV cache) on its prompt
    if args.logits:
        lines = [l for l in open(args.logits).read().splitlines() if l.strip()]
        prompt = torch.tensor([[int(t) for t in lines[0].split()[2:]]])
        theirs = torch.tensor([[float(x) for x in l.split()] for l in lines[1:]], dtype=torch.float64)
        with torch.no_grad():
            mine = HF(c, tensors).trunk(prompt)[0][0]
        r = ((mine - theirs).norm() / mine.norm()).item()
        check(r <= RTOL, f"generate -logits at {prompt.shape[1]} positions: the HF-convention forward's within "
                         f"rel {r:.1e}")

    # 5. every convention is exercised: without it, the loss misses
    def without(what, **change):
        w = dict(tensors)
        w.update(change.get("tensors", {}))
        with torch.no_grad():
            m2, t2, _ = HF(c, w, deinterleave=change.get("deinterleave", True),
                           groups=change.get("groups", True), yarn=change.get("yarn", True)).losses(inputs, targets)
        value, want = (t2, mtp) if change.get("mtp") else (m2, main)
        check(rel(value, want) > RTOL, f"without {what}: {value:.10f} (rel {rel(value, want):.1e} > {RTOL:g}: detected)")

    H = c["num_attention_heads"]
    if c["model_type"] == "llama":
        raw = {k: halves_to_interleaved(v, H) for k, v in tensors.items() if k.endswith(("q_proj.weight", "k_proj.weight"))}
        without("the q_proj/k_proj row permutation (our interleaved rows under rotate_half)", tensors=raw)
    else:
        without("the de-interleaving of the rope part (plain rotate_half)", deinterleave=False)
    if yarn_of(c) is not None:
        without("YaRN (the plain rotary embedding, the plain softmax scale)", yarn=False)
    if args.expect_bias:
        print(f"  the selection bias changed {hf.stats['bias_changed']} of {hf.stats['selections']} choices")
        check(hf.stats["bias_changed"] > 0, "the selection bias changes some expert choice")
        zero = {k: np.zeros_like(v) for k, v in tensors.items() if k.endswith("e_score_correction_bias")}
        without("e_score_correction_bias", tensors=zero)
    if c.get("n_routed_experts") and c["topk_method"] != "greedy" and c["topk_group"] < c["n_group"]:
        without(f"group-limited routing ({c['topk_method']}, {c['topk_group']} of {c['n_group']} groups; a plain "
                f"top-k of every expert)", groups=False)
    if c.get("n_routed_experts") and c.get("aux_loss_alpha", 0) > 0 and c.get("seq_aux", True):
        with torch.no_grad():  # the same loss over the batch as one sequence
            _, _, whole = HF(c, tensors, one_sequence=True).losses(inputs, targets)
        check(rel(whole, aux) > RTOL, f"without the split into sequences (the batch as one): aux {whole:.10f} "
                                      f"(rel {rel(whole, aux):.1e} > {RTOL:g}: detected)")
    L, C = c["num_hidden_layers"], c["hidden_size"]
    for d in range(c.get("num_nextn_predict_layers", 0)):
        eh = tensors[f"model.layers.{L + d}.eh_proj.weight"]
        without(f"the eh_proj column swap of MTP layer {L + d}", mtp=True,
                tensors={f"model.layers.{L + d}.eh_proj.weight": np.concatenate([eh[:, C:], eh[:, :C]], axis=1)})

    print("OK" if not failures else f"FAILED ({len(failures)})")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
