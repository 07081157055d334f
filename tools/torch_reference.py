#!/usr/bin/python3
"""Independent reference for xuanxue's models, in PyTorch (float64).

Covers the whole architecture: MHA or multi-head latent attention (MLA, with
or without the query latent, its latent norms at their own eps), dense SwiGLU
or DeepSeekMoE feed-forward (softmax gate with the expert-level auxiliary
balance loss over the batch or per sequence, or sigmoid gate with normalised
weights and selection biases, with or without the sequence-wise loss beside
them; group-limited routing; MoE on every layer_freq-th block), multi-token
prediction, and the plain rotary embedding or DeepSeek-V2's YaRN.

Reads the architecture from the checkpoint's deck attribute (the `model`,
`attention`, `moe`, `mtp` and `rope_scaling` lines), the weights from its /model group and the
MoE selection biases from /buffers/<prefix>ffn.gate_bias (zero when absent),
recomputes the total loss (main + weight * mtp + aux) and every gradient for
the batch in GRADS (written by tests/parity_dump), and compares:
  loss:      |ours - torch| / |torch|             <= 1e-5
  aux:       the balance loss alone, the same way (exactly zero where torch's is)
  gradients: ||ours - torch|| / ||torch||, per tensor <= 1e-4
A sequence-wise balance loss must also differ from the same loss taken over
the whole batch as one sequence by more than ten times the loss bound: else
the fixture could not tell the two apart.
Our side runs in float32, so both bounds leave room for float32 rounding only.
A checkpoint whose deck says `precision bf16` (or fp16) had 16-bit GEMM
operands: the bounds are then the type's (TOLERANCES below, and why).

usage: tools/torch_reference.py CHECKPOINT.h5 GRADS.h5
"""
import math
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xxpy.deck  # noqa: E402

# (loss, gradient) relative bounds per precision of the GEMM operands.
# fp32: float32 rounding only. A 16-bit type of p significant bits (bf16 8,
# fp16 11) rounds every GEMM operand with relative error <= u = 2^-p (bf16
# 3.9e-3, fp16 4.9e-4); products accumulate in fp32. Independent roundings
# add in quadrature and mostly cancel in the loss (a mean over tokens):
# bound u/4 (measured: <= 1e-5 bf16, 1.3e-7 fp16). A parameter gradient is a
# product of rounded operands on the way back through every layer: bound 5u
# (measured: <= 1.7u, 6.8e-3 bf16 and 8.3e-4 fp16, worst tensor of each
# architecture). fp16 is checked with a loss scale, as it trains. The bounds
# assume the rounding flips no top-k routing choice: a token whose top-k
# margin is below ~u of its logits moves between experts (deepseek's 4.5e-6
# margin does, in the first MTP block), which no tolerance of the arithmetic
# should excuse; the 16-bit checks use architectures without such a tie.
TOLERANCES = {"fp32": (1e-5, 1e-4), "bf16": (1e-3, 2e-2), "fp16": (1.25e-4, 2.5e-3)}


# ----------------------------------------------------------------------------
# configuration from the deck


def checkpoint_deck(h5file):
    """The deck a checkpoint keeps (its root attribute 'deck'), as text."""
    deck = h5file.attrs["deck"]
    return deck.decode() if isinstance(deck, bytes) else str(deck)


def model_config(deck):
    """Architecture of a checkpoint's deck at its first `run`, as the binary resolves it
    (xuanxue -print-config json); returns (cfg, the whole configuration)."""
    c = xxpy.deck.text_phases(deck)[0]["config"]
    return model_of(c), c


def model_of(c):
    """The model, attention, moe, mtp and rope_scaling values this reference reads, from a resolved configuration."""
    m, a, e = c["model"], c["attention"], c["moe"]
    cfg = {k: m[k] for k in ("vocab", "dim", "layers", "heads", "ffn", "seq", "rope_theta", "norm_eps")}
    cfg["kind"] = m["kind"]
    cfg["tie_embeddings"] = m.get("tie_embeddings", False)  # one tensor 'embed' is the embedding and the head
    att = {"kind": a["kind"]}
    if a["kind"] == "mla":
        att.update({k: a[k] for k in ("kv_lora_rank", "q_lora_rank", "qk_nope_dim", "rope_dim", "v_dim")})
        att["latent_eps"] = a.get("latent_eps") or m["norm_eps"]  # unset (0): the model's norm_eps
    r = c.get("rope_scaling", {"kind": "off"})
    cfg["rope_scaling"] = {"kind": r["kind"]}
    if r["kind"] == "yarn":
        cfg["rope_scaling"].update({k: r[k] for k in ("factor", "original_seq", "beta_fast", "beta_slow", "mscale",
                                                      "mscale_all_dim")})
    moe = {"mode": e["mode"]}
    if e["mode"] == "on":
        moe.update({k: e[k] for k in ("dense_layers", "shared", "routed", "topk", "ffn", "gate", "balance",
                                      "balance_coef", "aux_scope", "seq_aux", "route_scale", "groups", "layer_freq")})
        moe["topk_groups"] = e["topk_groups"] or e["groups"]  # 0: not given, every group
    cfg["attention"], cfg["moe"], cfg["mtp"] = att, moe, {"depth": c["mtp"]["depth"], "weight": c["mtp"]["weight"]}
    return cfg


def describe(cfg):
    a, m, t = cfg["attention"], cfg["moe"], cfg["mtp"]
    parts = [f"{cfg['kind']} dim {cfg['dim']} layers {cfg['layers']} heads {cfg['heads']}"]
    if cfg.get("tie_embeddings"):
        parts.append("tied embeddings (the head is 'embed')")
    if a["kind"] == "mla":
        parts.append(f"mla R {a['kv_lora_rank']} Q {a['q_lora_rank']} nope {a['qk_nope_dim']} "
                     f"rope {a['rope_dim']} v {a['v_dim']}")
    else:
        parts.append("mha")
    if m["mode"] == "on":
        parts.append(f"moe {m['routed']}x{m['topk']} shared {m['shared']} gate {m['gate']} balance {m['balance']}")
        if m["groups"] > 1:
            parts.append(f"{m['topk_groups']} of {m['groups']} expert groups")
        if m["layer_freq"] > 1:
            blocks = [l for l in range(cfg["layers"] + t["depth"]) if is_moe_layer(cfg, l)]
            parts.append(f"layer_freq {m['layer_freq']}: MoE blocks {blocks} of {cfg['layers'] + t['depth']}")
        if sequence_alpha(m) > 0:
            parts.append(f"sequence-wise balance loss alpha {sequence_alpha(m):g}")
    if t["depth"] > 0:
        parts.append(f"mtp depth {t['depth']} weight {t['weight']:g}")
    y = cfg.get("rope_scaling", {"kind": "off"})
    if y["kind"] == "yarn":
        parts.append(f"yarn factor {y['factor']:g} original_seq {y['original_seq']} beta {y['beta_fast']:g}/"
                     f"{y['beta_slow']:g} mscale {y['mscale']:g}/{y['mscale_all_dim']:g}")
    if a["kind"] == "mla" and a["latent_eps"] != cfg["norm_eps"]:
        parts.append(f"latent eps {a['latent_eps']:g}, norm eps {cfg['norm_eps']:g}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------
# building blocks, written from the math


def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def yarn_mscale(s, m):
    """YaRN's attention temperature factor (DeepSeek-V2's yarn_get_mscale)."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def rotary(D, cfg):
    """(inverse frequencies (D/2,), the cos/sin multiplier) of a rotary width D: theta^(-2i/D), or with
    rope_scaling yarn DeepSeek-V2's YaRN: pairs turning more than beta_fast times over original_seq
    positions keep theta^(-2i/D), fewer than beta_slow get it / factor, a linear ramp of pair indices between
    (the bounds rounded outward, clipped to [0, D-1]); the multiplier mscale(factor, mscale) /
    mscale(factor, mscale_all_dim)."""
    theta = cfg["rope_theta"]
    freqs = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    y = cfg.get("rope_scaling", {"kind": "off"})
    if y["kind"] == "off":
        return freqs, 1.0
    s, T0 = y["factor"], y["original_seq"]

    def pair_of(rotations):  # where theta^(-2i/D) * T0 = 2 pi rotations
        return D * math.log(T0 / (2 * math.pi * rotations)) / (2 * math.log(theta))

    lo = max(math.floor(pair_of(y["beta_fast"])), 0)
    hi = min(math.ceil(pair_of(y["beta_slow"])), D - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(D // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)  # 0: kept, 1: divided
    return freqs * (1 - ramp) + freqs / s * ramp, yarn_mscale(s, y["mscale"]) / yarn_mscale(s, y["mscale_all_dim"])


def score_scale(dqk, cfg):
    """The attention scores' scale: 1/sqrt(dqk), times mscale(factor, mscale_all_dim)^2 under YaRN."""
    y = cfg.get("rope_scaling", {"kind": "off"})
    gain = yarn_mscale(y["factor"], y["mscale_all_dim"]) ** 2 if y["kind"] == "yarn" else 1.0
    return gain / math.sqrt(dqk)


def rope(x, cfg):
    """x: (B, T, ..., D). Rotates pairs (2i, 2i+1) of the last dimension at
    position t by t * inv_freq[i] (rotary), as complex multiplication scaled
    by the tables' multiplier."""
    T, D = x.shape[1], x.shape[-1]
    freqs, gain = rotary(D, cfg)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), freqs)  # (T, D/2)
    rot = torch.polar(torch.full_like(angles, gain), angles)
    rot = rot.view(1, T, *([1] * (x.dim() - 3)), D // 2)
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], D // 2, 2).contiguous())
    rot = rot.to(xc.dtype)  # angles in float64; a float32 x stays float32
    return torch.view_as_real(xc * rot).reshape(x.shape)


def causal_attention(q, k, v, scale):
    """q, k: (B, T, H, Dqk); v: (B, T, H, Dv) -> (B, T, H*Dv); scores times scale."""
    B, T, H, Dqk = q.shape
    s = torch.einsum("bthd,bshd->bhts", q, k) * scale
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    o = torch.einsum("bhts,bshd->bthd", torch.softmax(s, dim=-1), v)
    return o.reshape(B, T, -1)


def mha(p, pre, h, cfg):
    B, T, C = h.shape
    H = cfg["heads"]
    D = C // H
    q = (h @ p[pre + "attn.wq"].T).view(B, T, H, D)
    k = (h @ p[pre + "attn.wk"].T).view(B, T, H, D)
    v = (h @ p[pre + "attn.wv"].T).view(B, T, H, D)
    return causal_attention(rope(q, cfg), rope(k, cfg), v, score_scale(D, cfg)) @ p[pre + "attn.wo"].T


def mla(p, pre, h, cfg):
    a = cfg["attention"]
    B, T, C = h.shape
    H, R, dn, dr, dv = cfg["heads"], a["kv_lora_rank"], a["qk_nope_dim"], a["rope_dim"], a["v_dim"]
    eps = a["latent_eps"]  # the q and kv latent norms'
    if a["q_lora_rank"] == 0:
        q = h @ p[pre + "attn.wq"].T
    else:
        q = rmsnorm(h @ p[pre + "attn.wq_a"].T, p[pre + "attn.q_norm"], eps) @ p[pre + "attn.wq_b"].T
    q = q.view(B, T, H, dn + dr)
    q = torch.cat([q[..., :dn], rope(q[..., dn:], cfg)], dim=-1)
    kv_a = h @ p[pre + "attn.wkv_a"].T  # (B, T, R + dr)
    c = kv_a[..., :R]
    k_rope = rope(kv_a[..., R:], cfg)  # (B, T, dr): one rope key for all heads
    kv = (rmsnorm(c, p[pre + "attn.kv_norm"], eps) @ p[pre + "attn.wkv_b"].T).view(B, T, H, dn + dv)
    k = torch.cat([kv[..., :dn], k_rope.unsqueeze(2).expand(B, T, H, dr)], dim=-1)
    v = kv[..., dn:]
    return causal_attention(q, k, v, score_scale(dn + dr, cfg)) @ p[pre + "attn.wo"].T


def swiglu(x, w1, w3, w2):
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def is_moe_layer(cfg, layer):
    """Whether block `layer` (MTP module d: layer cfg["layers"] + d) is MoE: past the dense
    layers, and a multiple of layer_freq (HF's moe_layer_freq)."""
    m = cfg["moe"]
    return m["mode"] == "on" and layer >= m["dense_layers"] and layer % m.get("layer_freq", 1) == 0


def select_experts(key, m, stats):
    """The k experts per row of key (N, E) = score + bias, in order: value descending, ties to the
    lower index. Group-limited (m["groups"] G > 1): the experts are G groups of E/G in index order;
    a group's value is its largest key (softmax gate) or the sum of its two largest (sigmoid); the
    topk_groups groups of the largest values (ties: the lower group) stay, and the k come from them."""
    N, E = key.shape
    k, G = m["topk"], m.get("groups", 1)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    if G > 1:
        g = m["topk_groups"]
        grouped = key.view(N, G, E // G)
        if m["gate"] == "sigmoid":
            group_value = torch.sort(grouped, dim=-1, descending=True).values[..., :2].sum(-1)
        else:
            group_value = grouped.max(dim=-1).values
        group_order = torch.sort(group_value, dim=-1, descending=True, stable=True).indices
        ranked_groups = torch.gather(group_value, 1, group_order)
        if g < G:
            stats["group_margin"] = min(stats.get("group_margin", math.inf),
                                        (ranked_groups[:, g - 1] - ranked_groups[:, g]).min().item())
        kept = torch.zeros(N, G, dtype=torch.bool).scatter(1, group_order[:, :g], True)
        kept = kept.repeat_interleave(E // G, dim=1)  # (N, E)
        # the kept experts first, each part still in key order (both sorts stable)
        kept_first = torch.sort(torch.gather(kept, 1, order).to(torch.int8), dim=-1, descending=True,
                                stable=True).indices
        plain = order[:, :k]
        order = torch.gather(order, 1, kept_first)
        stats["groups_changed"] = stats.get("groups_changed", 0) + \
            (torch.sort(plain, -1).values != torch.sort(order[:, :k], -1).values).any(-1).sum().item()
        key = key.masked_fill(~kept, -math.inf)  # an expert past the kept groups is never a runner-up
    ranked = torch.gather(key, 1, order)
    stats["margin"] = min(stats.get("margin", math.inf), (ranked[:, k - 1] - ranked[:, k]).min().item())
    return order[:, :k]


def moe_ffn(p, buffers, pre, h, cfg, stats):
    """DeepSeekMoE on h (B, T, C); returns (out, balance loss of this layer)."""
    m = cfg["moe"]
    B, T, C = h.shape
    E, k = m["routed"], m["topk"]
    x = h.reshape(B * T, C)
    N = x.shape[0]
    logits = x @ p[pre + "ffn.gate"].T  # (N, E)
    s = torch.sigmoid(logits) if m["gate"] == "sigmoid" else torch.softmax(logits, dim=-1)
    bias = buffers.get(pre + "ffn.gate_bias")
    bias = torch.zeros(E, dtype=x.dtype) if bias is None else bias
    with torch.no_grad():
        idx = select_experts(s + bias, m, stats)  # (N, k)
        plain = select_experts(s, m, {})
        changed = (torch.sort(plain, -1).values != torch.sort(idx, -1).values).any(-1).sum().item()
        stats["bias_changed"] = stats.get("bias_changed", 0) + changed
        stats["selections"] = stats.get("selections", 0) + N
    w = torch.gather(s, 1, idx)  # the bias never enters a weight
    if m["gate"] == "sigmoid":
        w = w / w.sum(-1, keepdim=True)
    w = w * m["route_scale"]
    combine = torch.zeros(N, E, dtype=x.dtype).scatter(1, idx, w)  # (N, E), zero where not selected
    out = torch.zeros_like(x)
    if m["shared"] > 0:
        out = out + swiglu(x, p[pre + "ffn.shared.w1"], p[pre + "ffn.shared.w3"], p[pre + "ffn.shared.w2"])
    for e in range(E):
        q = f"{pre}ffn.experts.{e}."
        out = out + combine[:, e:e + 1] * swiglu(x, p[q + "w1"], p[q + "w3"], p[q + "w2"])
    aux = torch.zeros((), dtype=x.dtype)
    if m["balance"] == "aux" and m.get("aux_scope", "batch") == "batch":
        with torch.no_grad():
            chosen = torch.zeros(N, E, dtype=x.dtype).scatter(1, idx, 1.0)
            f = E / (k * N) * chosen.sum(0)  # a constant: no gradient
        aux = m["balance_coef"] * (f * s.mean(0)).sum()
    alpha = sequence_alpha(m)
    if alpha > 0:  # in place of the batch-level loss (aux_scope sequence), or beside the bias
        with torch.no_grad():
            chosen = torch.zeros(N, E, dtype=x.dtype).scatter(1, idx, 1.0)
            one = sequence_balance_loss(s, chosen, 1, N, k, alpha, m["gate"] == "sigmoid")
            stats["aux_one_sequence"] = stats.get("aux_one_sequence", 0.0) + one.item()
        aux = sequence_balance_loss(s, chosen, B, T, k, alpha, m["gate"] == "sigmoid")
    return out.view(B, T, C), aux


def sequence_alpha(m):
    """The sequence-wise balance loss's alpha: balance aux with aux_scope sequence (DeepSeek-V2's
    seq_aux), or balance bias's seq_aux (DeepSeek-V3's complementary loss); 0: none."""
    if m["balance"] == "aux":
        return m["balance_coef"] if m.get("aux_scope", "batch") == "sequence" else 0.0
    return m.get("seq_aux", 0.0)


def sequence_balance_loss(s, chosen, B, T, k, alpha, sigmoid):
    """alpha * mean over the B sequences of sum_i f_i P_i, for scores s and the 0/1 choices `chosen`
    (B*T, E) of B sequences of T tokens: f_i = E / (k T) * (the sequence's tokens that chose i), a
    constant; P_i = the sequence's mean of s'_i, s' the scores normalised over all experts under
    the sigmoid gate (a softmax already sums to one)."""
    E = s.shape[-1]
    s_norm = s / s.sum(-1, keepdim=True) if sigmoid else s
    f = E / (k * T) * chosen.view(B, T, E).sum(1)  # (B, E)
    P = s_norm.view(B, T, E).mean(1)  # (B, E)
    return alpha * (f * P).sum(-1).mean()


def block(p, buffers, pre, x, cfg, is_moe, stats, moe=moe_ffn):
    """x + attention(attn_norm(x)), then + ffn(ffn_norm(.)); returns (x, aux).
    moe: the MoE feed-forward, moe_ffn here (every expert on every token, as
    the math reads); tools/lab/torch_train.py passes a routed one."""
    eps = cfg["norm_eps"]
    h = rmsnorm(x, p[pre + "attn_norm"], eps)
    x = x + (mla if cfg["attention"]["kind"] == "mla" else mha)(p, pre, h, cfg)
    h = rmsnorm(x, p[pre + "ffn_norm"], eps)
    if is_moe:
        y, aux = moe(p, buffers, pre, h, cfg, stats)
    else:
        y, aux = swiglu(h, p[pre + "ffn.w1"], p[pre + "ffn.w3"], p[pre + "ffn.w2"]), torch.zeros((), dtype=x.dtype)
    return x + y, aux


def loss_fn(p, buffers, cfg, inputs, targets, stats, moe=moe_ffn, head=None):
    """Total loss = main + mtp_weight * mtp + aux, and its parts. Runs in the
    dtype of the parameters (float64 here, float32 in tools/lab/torch_train.py).
    The head (main and every MTP depth) is p["head"], or p["embed"] itself
    when the embeddings are tied; `head` overrides it."""
    B, T = inputs.shape
    V, eps = cfg["vocab"], cfg["norm_eps"]
    dtype = p["embed"].dtype
    if head is None:
        head = p["embed"] if cfg.get("tie_embeddings") else p["head"]
    aux = torch.zeros((), dtype=dtype)
    x = p["embed"][inputs]
    for l in range(cfg["layers"]):
        x, a = block(p, buffers, f"layers.{l}.", x, cfg, is_moe_layer(cfg, l), stats, moe)
        aux = aux + a
    logits = rmsnorm(x, p["norm"], eps) @ head.T
    main = F.cross_entropy(logits.reshape(B * T, V), targets.reshape(-1))

    # multi-token prediction: depth d at position t reads token u_{t+d+1}
    # (= targets[t+d]; id 0 past the end) and predicts u_{t+d+2} (= targets[t+d+1]).
    D, lam = cfg["mtp"]["depth"], cfg["mtp"]["weight"]
    mtp = torch.zeros((), dtype=dtype)
    h = x
    for d in range(D):
        pre = f"mtp.{d}."
        tok = torch.zeros_like(targets)
        tok[:, :T - d] = targets[:, d:]
        label = torch.full_like(targets, -100)
        label[:, :T - d - 1] = targets[:, d + 1:]
        x0 = torch.cat([rmsnorm(h, p[pre + "hnorm"], eps), rmsnorm(p["embed"][tok], p[pre + "enorm"], eps)], -1)
        x0 = x0 @ p[pre + "proj"].T
        h, a = block(p, buffers, pre, x0, cfg, is_moe_layer(cfg, cfg["layers"] + d), stats, moe)
        aux = aux + a
        lg = rmsnorm(h, p[pre + "norm"], eps) @ head.T
        if T - d - 1 > 0:
            mtp = mtp + F.cross_entropy(lg.reshape(B * T, V), label.reshape(-1), ignore_index=-100)
    if D > 0:
        mtp = mtp / D
    return main + lam * mtp + aux, {"main": main.item(), "mtp": mtp.item(), "aux": aux.item()}


# ----------------------------------------------------------------------------


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    torch.set_num_threads(1)
    with h5py.File(sys.argv[1], "r") as ck, h5py.File(sys.argv[2], "r") as gr:
        cfg, config = model_config(checkpoint_deck(ck))
        precision = config["precision"]["kind"]
        LOSS_RTOL, GRAD_RTOL = TOLERANCES[precision]
        params = {name: torch.tensor(np.asarray(ck["model"][name]), dtype=torch.float64, requires_grad=True)
                  for name in ck["model"]}
        buffers = {name: torch.tensor(np.asarray(ck["buffers"][name]), dtype=torch.float64)
                   for name in (ck["buffers"] if "buffers" in ck else [])}
        inputs = torch.tensor(np.asarray(gr["inputs"]), dtype=torch.long)
        targets = torch.tensor(np.asarray(gr["targets"]), dtype=torch.long)
        ours_loss = float(np.asarray(gr["loss"])[0])
        ours_aux = float(np.asarray(gr["aux"])[0]) if "aux" in gr else None
        ours = {name: np.asarray(gr["grads"][name], dtype=np.float64) for name in gr["grads"]}
    stats = {}
    loss, parts = loss_fn(params, buffers, cfg, inputs, targets, stats)
    loss.backward()
    ok = True
    rel = abs(ours_loss - loss.item()) / abs(loss.item())
    ok &= rel <= LOSS_RTOL
    print(f"# model: {describe(cfg)}; GEMM operands {precision}")
    print(f"# torch loss parts: main {parts['main']:.8f} mtp {parts['mtp']:.8f} aux {parts['aux']:.8f}")
    if "margin" in stats:
        # float32 rounding could flip a selection whose margin is this small
        print(f"# routing: smallest top-k margin {stats['margin']:.2e}; the bias changed "
              f"{stats['bias_changed']} of {stats['selections']} selections")
    if "groups_changed" in stats:
        # group-limited routing that never changed a selection would check nothing
        acted = stats["groups_changed"] > 0
        ok &= acted
        print(f"# groups: smallest group margin {stats.get('group_margin', math.inf):.2e}; the groups changed "
              f"{stats['groups_changed']} of {stats['selections']} selections{'' if acted else '   FAILED'}")
    print(f"# {'tensor':<22} {'rel_err':>10} {'max_abs_err':>12}   (limit loss {LOSS_RTOL:g}, grads {GRAD_RTOL:g})")
    print(f"  {'loss':<22} {rel:>10.2e} {abs(ours_loss - loss.item()):>12.2e}   ours {ours_loss:.8f} torch {loss.item():.8f}")
    if ours_aux is not None:
        aux = parts["aux"]
        rel_aux = abs(ours_aux - aux) / abs(aux) if aux != 0 else (0.0 if ours_aux == 0 else math.inf)
        ok &= rel_aux <= LOSS_RTOL
        print(f"  {'aux':<22} {rel_aux:>10.2e} {abs(ours_aux - aux):>12.2e}   ours {ours_aux:.8f} torch {aux:.8f}"
              f"{'' if rel_aux <= LOSS_RTOL else '   FAILED'}")
    if "aux_one_sequence" in stats:
        # the same loss over the batch as one sequence: the fixture tells the two apart
        one, aux = stats["aux_one_sequence"], parts["aux"]
        apart = abs(aux - one) / abs(aux)
        ok &= apart > 10 * LOSS_RTOL
        print(f"# sequence-wise aux {aux:.8f}; over the batch as one sequence {one:.8f}: apart by {apart:.2e} "
              f"(must exceed {10 * LOSS_RTOL:g}){'' if apart > 10 * LOSS_RTOL else '   FAILED'}")
    if cfg.get("tie_embeddings"):
        # the head's share of the embedding's gradient: without it (the head
        # detached, the lookups alone) the fixture must fail
        ok &= "head" not in params
        lookups = {n: t.detach().clone().requires_grad_(n == "embed") for n, t in params.items()}
        loss_fn(lookups, buffers, cfg, inputs, targets, {}, head=lookups["embed"].detach())[0].backward()
        ref = params["embed"].grad.numpy()
        apart = np.linalg.norm(lookups["embed"].grad.numpy() - ref) / np.linalg.norm(ref)
        ok &= apart > 10 * GRAD_RTOL
        print(f"# tied: the head's share is {apart:.2e} of the embedding's gradient (must exceed {10 * GRAD_RTOL:g}); "
              f"'head' {'absent' if 'head' not in params else 'present   FAILED'}")
    if set(ours) != set(params):
        print("tensor names differ:", sorted(set(ours) ^ set(params)))
        ok = False
    worst = (0.0, "")
    for name in sorted(params):
        if name not in ours:
            continue
        ref = params[name].grad
        ref = np.zeros(params[name].shape) if ref is None else ref.numpy()
        mine = ours[name]
        if mine.shape != ref.shape:
            print(f"  {name:<22} shape {mine.shape} != {ref.shape}")
            ok = False
            continue
        diff = np.linalg.norm(mine - ref)
        # a tensor without gradient (an expert no token chose) must get exactly none from us too
        err = diff / np.linalg.norm(ref) if np.linalg.norm(ref) > 0 else (0.0 if diff == 0 else math.inf)
        ok &= err <= GRAD_RTOL
        worst = max(worst, (err, name))
        print(f"  {name:<22} {err:>10.2e} {np.abs(mine - ref).max():>12.2e}{'' if err <= GRAD_RTOL else '   FAILED'}")
    print(f"# worst gradient: {worst[1]} {worst[0]:.2e}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
