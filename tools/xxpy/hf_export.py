# The Hugging Face layout of a xuanxue model, for `tools/ckpt export FILE --format hf OUT_DIR`
# (docs/CHECKPOINT.md, "Export for other tools"): the deck's model as a config.json of
# LlamaForCausalLM (dense MHA), DeepseekV2ForCausalLM or DeepseekV3ForCausalLM, its tensors under
# the names and in the row order of those model codes in one model.safetensors, and the
# tokenizer the data line names (a SentencePiece model as tokenizer.model, a tokenizer.json as it
# is). numpy and the standard library only. `init hf DIR` reads it back (src/hf/, docs/HF.md).
#
# What is permuted, and why (our convention: kernels/rope.h, kernels/mla.h, tools/torch_reference.py):
#   - llama q_proj, k_proj: we rotate the interleaved pairs (2i, 2i+1) of each head; HF Llama's
#     rotate_half rotates (i, i + D/2) by the same angle t * theta^(-2i/D). The rows of each head
#     go from (pair i, member s) at 2i + s to s * D/2 + i (evens first, then odds), the inverse
#     of what HF's convert_llama_weights_to_hf does to Meta's weights. q.k is unchanged.
#   - deepseek: none. HF DeepSeek's apply_rotary_pos_emb (V2 remote code, V3's
#     apply_rotary_pos_emb_interleave) reads the rope part interleaved and de-interleaves it itself;
#     native DeepseekV2 rotates the pairs as complex numbers, as we do.
#   - MTP eh_proj: our proj multiplies [hnorm(h) | enorm(emb)]; DeepSeek-V3 (vLLM, SGLang)
#     concatenates [enorm(emb) | hnorm(h)]: the two column halves are swapped.

import json
import math
import os
import shutil
import struct
import tempfile

import numpy as np

from . import deck as xxdeck
from .fs import fsync_dir


class Refusal(Exception):
    """A model that has no Hugging Face counterpart, or an export that cannot be written as asked: exit 2."""


# ----------------------------------------------------------------------------
# the deck (the checkpoint's resolved deck text), as the binary resolves it


def deck_settings(deck):
    """The configuration in force at the first `run` of the checkpoint's deck (xuanxue -print-config json):
    {command: {keyword: value}}, every default filled in."""
    try:
        return xxdeck.text_phases(deck)[0]["config"]
    except xxdeck.DeckError as e:
        raise Refusal(f"its deck cannot be read back ({e})")


def model_of(s):
    """The model, attention, moe, mtp and rope_scaling values the export needs."""
    m, a, e = s["model"], s["attention"], s["moe"]
    out = {k: m[k] for k in ("kind", "vocab", "dim", "layers", "heads", "ffn", "seq", "rope_theta", "norm_eps",
                             "init_std")}
    out["tie_embeddings"] = bool(m.get("tie_embeddings", False))  # 'embed' is the head too
    out["attention"] = {"kind": a["kind"]}
    if a["kind"] == "mla":
        out["attention"].update({k: a[k] for k in ("kv_lora_rank", "q_lora_rank", "qk_nope_dim", "rope_dim", "v_dim",
                                                   "latent_eps")})  # latent_eps 0: unset, norm_eps
    out["moe"] = {"mode": e["mode"]}
    if e["mode"] == "on":
        out["moe"].update({k: e[k] for k in ("dense_layers", "shared", "routed", "topk", "ffn", "gate", "balance",
                                             "balance_coef", "aux_scope", "seq_aux", "route_scale", "groups",
                                             "layer_freq")})
        out["moe"]["topk_groups"] = e["topk_groups"] or e["groups"]  # 0: not given, every group
    out["mtp"] = {"depth": s["mtp"]["depth"], "weight": s["mtp"]["weight"]}
    out["rope_scaling"] = dict(s.get("rope_scaling", {"kind": "off"}))
    return out


def is_moe_layer(m, layer):
    """MoeConfig::is_moe_layer, HF's rule: layer >= first_k_dense_replace and layer % moe_layer_freq == 0
    (MTP module d is layer num_hidden_layers + d)."""
    e = m["moe"]
    return e["mode"] == "on" and layer >= e["dense_layers"] and layer % e["layer_freq"] == 0


# ----------------------------------------------------------------------------
# config.json: which HF model, and every key; or a refusal naming the option


# HF DeepSeek's q_a_layernorm and kv_a_layernorm are built as RMSNorm(rank) with the class default
# eps 1e-6, whatever rms_norm_eps says (V2 remote and native code, V3 likewise); ours use the attention
# line's latent_eps, or norm_eps where it is unset.
HF_LATENT_NORM_EPS = 1e-6


def refuse(option, why):
    raise Refusal(f"deck option '{option}' has no Hugging Face counterpart ({why}); nothing written")


def yarn_mscale(s, m):
    """YaRN's get_mscale (DeepSeek-V2's yarn_get_mscale, transformers' get_mscale)."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def hf_rope_scaling(m, llama, notes):
    """config.json's rope_scaling for the deck's rope_scaling line: None, or YaRN's keys as DeepSeek-V2's
    and V3's released configs carry them ("type" yarn; "rope_type" too, transformers' word)."""
    y = m["rope_scaling"]
    if y["kind"] == "off":
        return None
    f, ms, msa = y["factor"], y["mscale"], y["mscale_all_dim"]
    if llama and yarn_mscale(f, msa) != 1:
        refuse(f"rope_scaling yarn mscale_all_dim {msa:g}", "with attention mha: Llama's attention does not "
               "multiply its scores by mscale(factor, mscale_all_dim)^2 as DeepSeek's does (expected "
               "mscale_all_dim 0)")
    out = {"type": "yarn", "rope_type": "yarn", "factor": f, "original_max_position_embeddings": y["original_seq"],
           "beta_fast": y["beta_fast"], "beta_slow": y["beta_slow"], "mscale": ms, "mscale_all_dim": msa}
    # transformers' YaRN takes the tables' factor as mscale(f, mscale) / mscale(f, mscale_all_dim) only when
    # both are non-zero, else mscale(f, 1); DeepSeek's code always as the ratio, as we do. Where the two
    # differ, attention_factor (which transformers reads first, DeepSeek's code never) says ours.
    ours = yarn_mscale(f, ms) / yarn_mscale(f, msa)
    if ours != (ours if ms and msa else yarn_mscale(f, 1)):
        out["attention_factor"] = ours
        notes.append(f"rope_scaling: attention_factor {ours!r} written, the cos/sin factor of our deck, which "
                     f"transformers would otherwise take as mscale({f:g}, 1) with mscale {ms:g}, mscale_all_dim "
                     f"{msa:g}")
    if m["seq"] != f * y["original_seq"]:
        notes.append(f"rope_scaling: max_position_embeddings {m['seq']} (seq) is not factor x "
                     f"original_max_position_embeddings = {f * y['original_seq']:g}; DeepSeek's code and current "
                     f"transformers use factor {f:g}, transformers 4.48 to 4.5x derive it from that ratio instead")
    return out


def hf_config(m, tokens, latent_eps=False):
    """(model_type, config dict, notes) for the model m (model_of); tokens: bos/eos ids or None.
    latent_eps: export an MLA model whose latent norms' eps is not 1e-6 anyway (--latent-eps-1e-6)."""
    a, e, t = m["attention"], m["moe"], m["mtp"]
    L, D, C, H = m["layers"], t["depth"], m["dim"], m["heads"]
    moe_on = e["mode"] == "on"
    notes = []
    common = {
        "vocab_size": m["vocab"], "hidden_size": C, "intermediate_size": m["ffn"], "num_hidden_layers": L,
        "num_attention_heads": H, "num_key_value_heads": H, "hidden_act": "silu",
        "max_position_embeddings": m["seq"], "rms_norm_eps": m["norm_eps"], "rope_theta": m["rope_theta"],
        "rope_scaling": hf_rope_scaling(m, a["kind"] == "mha", notes), "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": m["init_std"], "tie_word_embeddings": m["tie_embeddings"], "use_cache": True,
        "bos_token_id": tokens.get("bos"), "eos_token_id": tokens.get("eos"), "pad_token_id": None,
        "torch_dtype": "float32",
    }
    if a["kind"] == "mha":
        if moe_on:
            refuse("moe on", "with attention mha: Llama has no experts, and HF's DeepSeek models attend with "
                             "MLA only; use attention mla")
        if D > 0:
            refuse(f"mtp depth {D}", "with attention mha: Llama has no multi-token prediction; MTP is "
                                     "DeepSeek-V3's (attention mla)")
        if C % H:
            refuse(f"model dim {C} heads {H}", "Llama's q_proj is heads x dim/heads rows")
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common, "head_dim": C // H,
                  "mlp_bias": False, "pretraining_tp": 1}
        notes.append("rope: q_proj and k_proj rows of each head permuted from interleaved pairs (2i, 2i+1) "
                     "to halves (i, i + head_dim/2) for Llama's rotate_half")
        return "llama", config, notes

    eps = a["latent_eps"] or m["norm_eps"]  # our latent norms'
    if eps != HF_LATENT_NORM_EPS and not latent_eps:
        option, ours = ((f"attention mla latent_eps {eps:g}", "its latent_eps") if a["latent_eps"] else
                        (f"model norm_eps {eps:g}", "norm_eps, as no latent_eps is set"))
        refuse(option, f"HF DeepSeek's q_a_layernorm and kv_a_layernorm are fixed at eps {HF_LATENT_NORM_EPS:g} "
               f"whatever rms_norm_eps says; this model's latent norms use {ours}: train with `attention mla ... "
               f"latent_eps 1e-6` (rms_norm_eps stays norm_eps, for every other norm), or pass --latent-eps-1e-6 "
               f"to accept that change of those two norms")
    if eps != HF_LATENT_NORM_EPS:
        notes.append(f"--latent-eps-1e-6: HF's q_a_layernorm and kv_a_layernorm will use eps 1e-6, not the "
                     f"trained {eps:g} (rms_norm_eps, every other norm, stays {m['norm_eps']:g})")
    if moe_on and e["gate"] == "softmax" and e["balance"] == "bias":
        refuse("moe gate softmax balance bias", "DeepSeek-V2's softmax gate has no selection bias and "
                                                "DeepSeek-V3's bias (e_score_correction_bias) needs gate sigmoid")
    if moe_on and e["gate"] == "softmax" and D > 0:
        refuse(f"mtp depth {D}", "with moe gate softmax: MTP is DeepSeek-V3's, whose gate is sigmoid; "
                                 "DeepSeek-V2 has no MTP")
    if moe_on and e["gate"] == "sigmoid" and e["topk"] < 2:
        refuse(f"moe topk {e['topk']} gate sigmoid", "we normalise the one selected score to 1; DeepSeek-V3's "
                                                    "remote code normalises only when top_k > 1")
    v3 = (moe_on and e["gate"] == "sigmoid") or D > 0
    model_type = "deepseek_v3" if v3 else "deepseek_v2"
    config = {"architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
              "model_type": model_type, **common,
              "kv_lora_rank": a["kv_lora_rank"], "q_lora_rank": a["q_lora_rank"] or None,
              "qk_rope_head_dim": a["rope_dim"], "qk_nope_head_dim": a["qk_nope_dim"], "v_head_dim": a["v_dim"],
              "moe_layer_freq": 1, "ep_size": 1, "n_group": 1, "topk_group": 1, "seq_aux": False,
              "scoring_func": "sigmoid" if v3 else "softmax", "topk_method": "noaux_tc" if v3 else "greedy",
              "norm_topk_prob": v3}
    if moe_on:
        # the balance loss: balance aux's alpha over the batch (seq_aux false) or per sequence (aux_scope
        # sequence: seq_aux true); beside the bias, the sequence-wise loss's alpha (seq_aux X > 0: true)
        aux = e["balance"] == "aux"
        config.update(n_shared_experts=e["shared"], n_routed_experts=e["routed"], num_experts_per_tok=e["topk"],
                      moe_intermediate_size=e["ffn"], first_k_dense_replace=e["dense_layers"],
                      routed_scaling_factor=e["route_scale"],
                      aux_loss_alpha=e["balance_coef"] if aux else e["seq_aux"],
                      seq_aux=e["aux_scope"] == "sequence" if aux else e["seq_aux"] > 0,
                      # group-limited routing: V3's noaux_tc always groups; V2's softmax gate as
                      # group_limited_greedy (plain greedy ignores n_group and topk_group)
                      n_group=e["groups"], topk_group=e["topk_groups"], moe_layer_freq=e["layer_freq"],
                      topk_method="noaux_tc" if v3 else "group_limited_greedy" if e["groups"] > 1 else "greedy")
        if e["groups"] > 1:
            notes.append(f"moe: group-limited routing, {e['groups']} groups of {e['routed'] // e['groups']} experts, "
                         f"{e['topk_groups']} kept per token (topk_method {config['topk_method']})")
        if e["balance"] == "bias":
            notes.append("moe: the selection biases (/buffers/*.ffn.gate_bias) are mlp.gate.e_score_correction_bias"
                         f"; balance_coef {e['balance_coef']:g} (their update step) is training only")
            if e["seq_aux"] > 0:
                notes.append(f"moe: seq_aux {e['seq_aux']:g}, the sequence-wise loss beside the bias: seq_aux true, "
                             "aux_loss_alpha (HF's V3 code computes no balance loss: training only)")
        elif v3:
            notes.append("moe: balance aux under gate sigmoid: e_score_correction_bias is zero; HF's V3 code "
                         "computes no auxiliary loss (aux_loss_alpha is kept for reference; init hf reads "
                         "gate sigmoid as balance bias)")
    else:  # every layer, MTP's included, keeps the dense FFN: all below first_k_dense_replace
        config.update(n_shared_experts=None, n_routed_experts=None, num_experts_per_tok=None,
                      moe_intermediate_size=None, first_k_dense_replace=L + D, routed_scaling_factor=1.0,
                      aux_loss_alpha=0.0)
    if v3:
        config.update(num_nextn_predict_layers=D, rope_interleave=True)
    if m["tie_embeddings"]:
        notes.append("tied embeddings: tie_word_embeddings true, no lm_head.weight (model.embed_tokens.weight is "
                     "the head" + (", and every MTP layer's shared_head.head a copy of it)" if D > 0 else ")"))
    if D > 0:
        layers = f"model.layers.{L}" + (f"..{L + D - 1}" if D > 1 else "")
        notes.append(f"mtp: {layers} (eh_proj column halves swapped to [enorm | hnorm]; "
                     f"embed_tokens and shared_head.head are copies of the shared ones); mtp weight "
                     f"{t['weight']:g} is training only")
    return model_type, config, notes


# ----------------------------------------------------------------------------
# tensors: our names (src/model/params.cpp) to HF's, in the HF row order


def interleaved_to_halves(w, heads):
    """Rows of each head from pairs (2i, 2i+1) to halves (i, i + D/2): row 2i + s goes to s * D/2 + i."""
    rows, cols = w.shape
    d = rows // heads
    return w.reshape(heads, d // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def hf_tensors(m, model_type, tensors, buffers):
    """[(hf_name, float32 array)] from our /model tensors (name -> array) and /buffers. Raises
    Refusal when the file's tensors are not the deck's model (a name missing, a shape, one left over)."""
    a, e = m["attention"], m["moe"]
    L, D, C, H, V = m["layers"], m["mtp"]["depth"], m["dim"], m["heads"], m["vocab"]
    used, out = set(), []

    def get(name, shape):
        if name not in tensors:
            raise Refusal(f"tensor '/model/{name}' is missing (expected by the deck's model)")
        value = tensors[name]
        if tuple(value.shape) != tuple(shape):
            raise Refusal(f"tensor '/model/{name}' has shape {list(value.shape)} (expected {list(shape)} "
                          f"from the deck's model)")
        used.add(name)
        return np.asarray(value, dtype=np.float32)

    def put(name, value):
        out.append((name, np.ascontiguousarray(value, dtype=np.float32)))

    def mlp(ours, hf, width):  # SwiGLU: w1 gate, w3 up, w2 down
        put(hf + "gate_proj.weight", get(ours + "w1", (width, C)))
        put(hf + "up_proj.weight", get(ours + "w3", (width, C)))
        put(hf + "down_proj.weight", get(ours + "w2", (C, width)))

    def block(ours, hf, moe):
        put(hf + "input_layernorm.weight", get(ours + "attn_norm", (C,)))
        s = hf + "self_attn."
        if model_type == "llama":
            put(s + "q_proj.weight", interleaved_to_halves(get(ours + "attn.wq", (C, C)), H))
            put(s + "k_proj.weight", interleaved_to_halves(get(ours + "attn.wk", (C, C)), H))
            put(s + "v_proj.weight", get(ours + "attn.wv", (C, C)))
            put(s + "o_proj.weight", get(ours + "attn.wo", (C, C)))
        else:
            R, Q, dn, dr, dv = a["kv_lora_rank"], a["q_lora_rank"], a["qk_nope_dim"], a["rope_dim"], a["v_dim"]
            if Q == 0:
                put(s + "q_proj.weight", get(ours + "attn.wq", (H * (dn + dr), C)))
            else:
                put(s + "q_a_proj.weight", get(ours + "attn.wq_a", (Q, C)))
                put(s + "q_a_layernorm.weight", get(ours + "attn.q_norm", (Q,)))
                put(s + "q_b_proj.weight", get(ours + "attn.wq_b", (H * (dn + dr), Q)))
            put(s + "kv_a_proj_with_mqa.weight", get(ours + "attn.wkv_a", (R + dr, C)))
            put(s + "kv_a_layernorm.weight", get(ours + "attn.kv_norm", (R,)))
            put(s + "kv_b_proj.weight", get(ours + "attn.wkv_b", (H * (dn + dv), R)))
            put(s + "o_proj.weight", get(ours + "attn.wo", (C, H * dv)))
        put(hf + "post_attention_layernorm.weight", get(ours + "ffn_norm", (C,)))
        if not moe:
            mlp(ours + "ffn.", hf + "mlp.", m["ffn"])
            return
        E, F = e["routed"], e["ffn"]
        put(hf + "mlp.gate.weight", get(ours + "ffn.gate", (E, C)))
        if model_type == "deepseek_v3":
            bias = buffers.get(ours + "ffn.gate_bias")
            bias = np.zeros(E, np.float32) if bias is None else np.asarray(bias, np.float32).reshape(-1)
            if bias.shape != (E,):
                raise Refusal(f"buffer '/buffers/{ours}ffn.gate_bias' has {bias.size} values (expected {E})")
            put(hf + "mlp.gate.e_score_correction_bias", bias)
        elif ours + "ffn.gate_bias" in buffers and np.any(buffers[ours + "ffn.gate_bias"] != 0):
            raise Refusal(f"buffer '/buffers/{ours}ffn.gate_bias' is not zero, but DeepSeek-V2 has no selection bias")
        if e["shared"] > 0:
            mlp(ours + "ffn.shared.", hf + "mlp.shared_experts.", e["shared"] * F)
        else:  # n_shared_experts 0: HF builds a shared MLP of width 0
            put(hf + "mlp.shared_experts.gate_proj.weight", np.zeros((0, C)))
            put(hf + "mlp.shared_experts.up_proj.weight", np.zeros((0, C)))
            put(hf + "mlp.shared_experts.down_proj.weight", np.zeros((C, 0)))
        for j in range(E):
            mlp(f"{ours}ffn.experts.{j}.", f"{hf}mlp.experts.{j}.", F)

    embed = get("embed", (V, C))
    put("model.embed_tokens.weight", embed)
    for l in range(L):
        block(f"layers.{l}.", f"model.layers.{l}.", is_moe_layer(m, l))
    put("model.norm.weight", get("norm", (C,)))
    if m["tie_embeddings"]:  # one tensor: HF reads model.embed_tokens.weight as the head too, no lm_head
        head = embed
    else:
        head = get("head", (V, C))
        put("lm_head.weight", head)
    for d in range(D):  # DeepSeek-V3's MTP modules: layer index num_hidden_layers + d
        ours, hf = f"mtp.{d}.", f"model.layers.{L + d}."
        put(hf + "embed_tokens.weight", embed)
        put(hf + "enorm.weight", get(ours + "enorm", (C,)))
        put(hf + "hnorm.weight", get(ours + "hnorm", (C,)))
        proj = get(ours + "proj", (C, 2 * C))  # ours multiplies [hnorm(h) | enorm(emb)]
        put(hf + "eh_proj.weight", np.concatenate([proj[:, C:], proj[:, :C]], axis=1))
        block(ours, hf, is_moe_layer(m, L + d))
        put(hf + "shared_head.norm.weight", get(ours + "norm", (C,)))
        put(hf + "shared_head.head.weight", head)
    left = sorted(set(tensors) - used)
    if left:
        raise Refusal(f"tensor '/model/{left[0]}' has no place in the deck's model ({len(left)} such tensors)")
    return out


# ----------------------------------------------------------------------------
# safetensors: u64 little-endian header length N, N bytes of JSON (padded with spaces to a multiple
# of 8), then the tensors' bytes back to back; data_offsets count from the byte after the header


def safetensors_header(tensors, metadata):
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    offset = 0
    for name, value in tensors:
        header[name] = {"dtype": "F32", "shape": list(value.shape), "data_offsets": [offset, offset + value.nbytes]}
        offset += value.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(raw) + (-len(raw) % 8)) + raw + b" " * (-len(raw) % 8)


def write_safetensors(path, tensors, metadata):
    with open(path, "wb") as f:
        f.write(safetensors_header(tensors, metadata))
        for _, value in tensors:
            f.write(value.astype("<f4", copy=False).tobytes())
        f.flush()
        os.fsync(f.fileno())


# ----------------------------------------------------------------------------
# the tokenizer: a SentencePiece ModelProto, read just far enough to count and name its pieces


def _varint(buf, i):
    shift = value = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _fields(buf):
    """(field number, wire type, value) of one protobuf message; value: int or bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ValueError("field 0")
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        if i > len(buf):
            raise ValueError("truncated field")
        yield field, wire, value


def sentencepiece_pieces(data):
    """[(piece, type)] of a SentencePiece model (ModelProto field 1; SentencePiece: 1 piece, 3 type,
    1 NORMAL 2 UNKNOWN 3 CONTROL 4 USER_DEFINED 5 UNUSED 6 BYTE). ValueError: not one."""
    pieces = []
    for field, wire, value in _fields(data):
        if field == 1:
            if wire != 2:
                raise ValueError("pieces are not messages")
            piece, kind = None, 1
            for f, w, v in _fields(value):
                if f == 1 and w == 2:
                    piece = v.decode("utf-8")
                elif f == 3 and w == 0:
                    kind = v
            if piece is None:
                raise ValueError("a piece without text")
            pieces.append((piece, kind))
    if not pieces or sum(kind == 2 for _, kind in pieces) != 1:
        raise ValueError("no pieces, or not exactly one unknown piece")
    return pieces


def tokenizer_files(path, vocab, seq):
    """(model bytes, tokenizer_config dict, {bos, eos} ids) of the SentencePiece model at path."""
    try:
        data = open(path, "rb").read()
        pieces = sentencepiece_pieces(data)
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise Refusal(f"tokenizer '{path}' is not a readable SentencePiece model ({err})")
    if len(pieces) != vocab:
        raise Refusal(f"tokenizer '{path}' has {len(pieces)} pieces, but the model has vocab {vocab} "
                      f"(expected the tokenizer the model was trained with)")
    ids = {p: i for i, (p, kind) in enumerate(pieces) if kind == 3}
    unk = next(p for p, kind in pieces if kind == 2)
    config = {
        # the slow LlamaTokenizer in legacy mode without a prefix space calls SentencePiece as it is;
        # the training stream holds no <s> or </s> (tools/prepare-data), so none are added
        "tokenizer_class": "LlamaTokenizer", "model_max_length": seq,
        "unk_token": unk, "bos_token": "<s>" if "<s>" in ids else None, "eos_token": "</s>" if "</s>" in ids else None,
        "pad_token": None, "add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
        "legacy": True, "clean_up_tokenization_spaces": False, "sp_model_kwargs": {},
    }
    return data, config, {"bos": ids.get("<s>"), "eos": ids.get("</s>")}


def hf_tokenizer_files(path, vocab, seq):
    """(tokenizer.json bytes, tokenizer_config dict, {bos, eos} ids) of a Hugging Face byte-level BPE
    tokenizer.json (what `init hf` models come with): copied as it is; its ids must fit the model's vocab."""
    try:
        data = open(path, "rb").read()
        doc = json.loads(data)
        ids = list(doc["model"]["vocab"].values()) + [t["id"] for t in doc.get("added_tokens") or []]
        if doc["model"].get("type") != "BPE" or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise ValueError("not a BPE model with integer ids")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise Refusal(f"tokenizer '{path}' is not a readable tokenizer.json ({err})")
    if max(ids) >= vocab:
        raise Refusal(f"tokenizer '{path}' has id {max(ids)}, but the model has vocab {vocab} "
                      f"(expected the tokenizer the model was trained with)")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": seq,
              "clean_up_tokenization_spaces": False}
    return data, config, {}


def tokenizer_path(settings, override):
    """The tokenizer to copy (None: none), and a line saying which and why."""
    data = settings.get("data", {})
    named = data.get("tokenizer", "")
    if override:
        path, why = override, "given by --tokenizer"
    elif named:
        path, why = named, "named by the deck's data line"
    elif data.get("format") == "bytes":
        return None, (f"no tokenizer: the deck's data is byte-level (data bytes, token = byte value, vocab "
                      f"{settings['model'].get('vocab')}); no tokenizer file written")
    else:
        return None, ("no tokenizer: the deck's data line names none (shards of an unchecked tokenizer); "
                      "pass --tokenizer MODEL to include one")
    if not os.path.isfile(path):
        where = ""
        if not os.path.isabs(path):
            where = f" (looked for {os.path.abspath(path)}"
            where += (": a relative path in the deck starts at the training run's working directory; run from "
                      "there or pass --tokenizer MODEL)" if not override else ")")
        raise Refusal(f"the tokenizer '{path}' {why} is missing{where}; nothing written")
    return path, why


# ----------------------------------------------------------------------------
# the directory, written whole or not at all


def check_out_dir(out, force):
    """Refuses an OUT_DIR that is a file, non-empty without --force, or whose parent is missing."""
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise Refusal(f"{out}: its parent directory {parent} does not exist (expected a directory to write into)")
    if os.path.lexists(out):
        if not os.path.isdir(out) or os.path.islink(out):
            raise Refusal(f"{out}: exists and is not a directory (expected a new or empty directory)")
        if os.listdir(out) and not force:
            raise Refusal(f"{out}: exists and is not empty (expected a new or empty directory; --force replaces it)")


def write_dir(out, files, force):
    """files: {name: bytes or callable(path)}. Everything goes into a temp directory next to OUT_DIR,
    fsynced, then renamed into place (an existing OUT_DIR, empty or with --force, is replaced): a
    failure leaves OUT_DIR as it was and no temp directory behind."""
    check_out_dir(out, force)
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out) + ".tmp.", dir=parent)
    old = None
    try:
        for name, content in files.items():
            path = os.path.join(tmp, name)
            if callable(content):
                content(path)
                continue
            with open(path, "wb") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # as mkdir would make it (mkdtemp's 0700 would follow the rename)
        fsync_dir(tmp)
        if os.path.isdir(out):
            if os.listdir(out):
                old = tempfile.mkdtemp(prefix=os.path.basename(out) + ".old.", dir=parent)
                os.rename(out, os.path.join(old, "replaced"))
            else:
                os.rmdir(out)
        os.rename(tmp, out)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old and not os.path.exists(out):
            os.rename(os.path.join(old, "replaced"), out)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old:
        shutil.rmtree(old, ignore_errors=True)


def export(out, settings, tensors, buffers, metadata, force=False, tokenizer=None, latent_eps=False):
    """Checks everything, then writes OUT_DIR; returns the lines to print."""
    m = model_of(settings)
    check_out_dir(out, force)
    tok_path, tok_line = tokenizer_path(settings, tokenizer)
    files, ids = {}, {}
    if tok_path:
        kind, name, read = (("byte-level BPE", "tokenizer.json", hf_tokenizer_files) if tok_path.endswith(".json")
                            else ("sentencepiece", "tokenizer.model", tokenizer_files))
        data, tok_config, ids = read(tok_path, m["vocab"], m["seq"])
        files[name] = data
        files["tokenizer_config.json"] = (json.dumps(tok_config, indent=2) + "\n").encode()
        tok_line = f"tokenizer: {tok_path} ({tok_line}; {kind}, vocab {m['vocab']}) as {name}"
    model_type, config, notes = hf_config(m, ids, latent_eps)
    named = hf_tensors(m, model_type, tensors, buffers)
    files["config.json"] = (json.dumps(config, indent=2) + "\n").encode()
    files["model.safetensors"] = lambda path: write_safetensors(path, named, {"format": "pt", **metadata})
    write_dir(out, files, force)
    count = sum(v.size for _, v in named)
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    lines = [f"{out}: {config['architectures'][0]} (model_type {model_type}), {len(named)} tensors, "
             f"{count} values, model.safetensors {size / 2**20:.1f} MiB; " + ", ".join(sorted(files))]
    return lines + ["  " + n for n in notes] + ["  " + tok_line]
