"""tools/ckpt export FILE --format hf OUT_DIR: a checkpoint as a Hugging Face
model directory (docs/CHECKPOINT.md, "Export for other tools").

  OUT_DIR/config.json         the config keys of the HF model code
  OUT_DIR/model.safetensors   the tensors under HF names, float32
  OUT_DIR/tokenizer.model     the SentencePiece model the deck's data line names
  OUT_DIR/tokenizer_config.json

Families: `model dense` (and `model deepseek` with `attention mha` and no MoE)
is Llama (LlamaForCausalLM); MLA is DeepSeek-V2 (softmax gate, or no MoE)
or DeepSeek-V3 (sigmoid gate, or multi-token prediction). What has no
counterpart is refused by name. The safetensors format: an 8-byte
little-endian header length N, N bytes of JSON {name: {dtype, shape,
data_offsets}} (padded with spaces to a multiple of 8), then the raw
little-endian data; written here with numpy alone.
"""
import json
import os
import shlex
import shutil
import struct

import numpy as np


class Refused(Exception):
    """An option with no counterpart in the target's config: exit 2 naming it."""


# ----------------------------------------------------------------------------
# the deck


def deck_config(deck):
    """model/attention/moe/mtp/data settings of a resolved deck (defaults as src/deck/config.h);
    the last line of each command before the first `run` wins."""
    c = {"model": None, "attention": {"kind": "mha"}, "moe": {"mode": "off"}, "mtp": {"depth": 0, "weight": 0.3},
         "data": {}}
    for line in deck.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        cmd, kind, kv = words[0], words[1] if len(words) > 1 else "", {}
        if cmd == "run":
            break
        if cmd == "model":
            kv = dict(zip(words[2::2], words[3::2]))
            c["model"] = {"kind": kind, **{k: int(kv[k]) for k in ("vocab", "dim", "layers", "heads", "ffn", "seq")},
                          "rope_theta": float(kv.get("rope_theta", 10000.0)),
                          "norm_eps": float(kv.get("norm_eps", 1e-5))}
        elif cmd == "attention":
            kv = dict(zip(words[2::2], words[3::2]))
            c["attention"] = {"kind": kind, **{k: int(v) for k, v in kv.items()}}
            c["attention"].setdefault("q_lora_rank", 0)
        elif cmd == "moe":
            kv = dict(zip(words[2::2], words[3::2]))
            c["moe"] = {"mode": kind, "dense_layers": int(kv.get("dense_layers", 1)),
                        "shared": int(kv.get("shared", 0)), "routed": int(kv.get("routed", 0)),
                        "topk": int(kv.get("topk", 0)), "ffn": int(kv.get("ffn", 0)),
                        "gate": kv.get("gate", "softmax"), "balance": kv.get("balance", "aux"),
                        "balance_coef": float(kv.get("balance_coef", 0.001)),
                        "route_scale": float(kv.get("route_scale", 1.0))}
        elif cmd == "mtp":
            kv = dict(zip(words[1::2], words[2::2]))
            c["mtp"] = {"depth": int(kv.get("depth", 0)), "weight": float(kv.get("weight", 0.3))}
        elif cmd == "data":
            kv = dict(zip(words[3::2], words[4::2]))
            c["data"] = {"format": kind, "path": words[2] if len(words) > 2 else "", "tokenizer": kv.get("tokenizer", "")}
    if c["model"] is None:
        raise Refused("the checkpoint's deck has no model line")
    return c


# ----------------------------------------------------------------------------
# families and their config keys


def family(c):
    """'llama', 'deepseek_v2' or 'deepseek_v3', or Refused naming the option."""
    att, moe, mtp = c["attention"], c["moe"], c["mtp"]
    moe_on = moe["mode"] == "on"
    if att["kind"] != "mla":
        if moe_on:
            raise Refused("moe on with attention mha: Llama has no experts and the HF DeepSeek code is MLA only "
                          "(expected attention mla, or moe off)")
        if mtp["depth"] > 0:
            raise Refused(f"mtp depth {mtp['depth']} with attention mha: Llama has no multi-token prediction "
                          f"(expected mtp depth 0, attention mla for DeepSeek-V3, or --drop-mtp)")
        return "llama"
    if moe_on and moe["gate"] == "softmax" and moe["balance"] == "bias":
        raise Refused("moe gate softmax with balance bias: DeepSeek-V2 has no selection bias and V3's bias routing "
                      "(noaux_tc) is sigmoid only (expected gate sigmoid, or balance aux)")
    if moe_on and moe["gate"] == "softmax" and mtp["depth"] > 0:
        raise Refused(f"mtp depth {mtp['depth']} with moe gate softmax: DeepSeek-V2 has no multi-token prediction "
                      f"and V3 routes with sigmoid (expected gate sigmoid, mtp depth 0, or --drop-mtp)")
    if (moe_on and moe["gate"] == "sigmoid") or mtp["depth"] > 0:
        return "deepseek_v3"
    return "deepseek_v2"


def hf_config(c, fam):
    m, att, moe, mtp = c["model"], c["attention"], c["moe"], c["mtp"]
    common = {"vocab_size": m["vocab"], "hidden_size": m["dim"], "intermediate_size": m["ffn"],
              "num_hidden_layers": m["layers"], "num_attention_heads": m["heads"],
              "num_key_value_heads": m["heads"], "max_position_embeddings": m["seq"],
              "rms_norm_eps": m["norm_eps"], "rope_theta": m["rope_theta"], "rope_scaling": None,
              "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
              "initializer_range": 0.02, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    if fam == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common,
                "head_dim": m["dim"] // m["heads"], "mlp_bias": False}
    moe_on = moe["mode"] == "on"
    cfg = {"architectures": ["DeepseekV3ForCausalLM" if fam == "deepseek_v3" else "DeepseekV2ForCausalLM"],
           "model_type": fam, **common,
           "q_lora_rank": att["q_lora_rank"] or None, "kv_lora_rank": att["kv_lora_rank"],
           "qk_nope_head_dim": att["qk_nope_dim"], "qk_rope_head_dim": att["rope_dim"],
           "v_head_dim": att["v_dim"],
           "moe_intermediate_size": moe["ffn"] if moe_on else None,
           "n_shared_experts": moe["shared"] if moe_on else None,
           "n_routed_experts": moe["routed"] if moe_on else None,
           "num_experts_per_tok": moe["topk"] if moe_on else None,
           "first_k_dense_replace": moe["dense_layers"] if moe_on else m["layers"],
           "moe_layer_freq": 1, "routed_scaling_factor": moe["route_scale"] if moe_on else 1.0,
           "n_group": 1, "topk_group": 1, "ep_size": 1,
           "aux_loss_alpha": moe["balance_coef"] if moe_on and moe["balance"] == "aux" else 0.0,
           "seq_aux": False, "attention_dropout": 0.0}
    if fam == "deepseek_v2":
        cfg.update({"scoring_func": "softmax", "topk_method": "greedy", "norm_topk_prob": False})
    else:
        cfg.update({"scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
                    "num_nextn_predict_layers": mtp["depth"]})
    return cfg


# ----------------------------------------------------------------------------
# tensors


def halves(w, heads):
    """Rows of each head from our interleaved rope pairs (2i, 2i+1) to HF Llama's halves (i, i + D/2):
    rotate_half rotates those. Both q and k are permuted alike, so q . k is unchanged."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


def block_tensors(t, ours, hf, c, fam, moe_layer, out):
    """One block's tensors under HF names: ours is our prefix ("layers.3."), hf the HF one."""
    m, att = c["model"], c["attention"]
    C, H = m["dim"], m["heads"]
    out[hf + "input_layernorm.weight"] = t[ours + "attn_norm"]
    out[hf + "post_attention_layernorm.weight"] = t[ours + "ffn_norm"]
    a = ours + "attn."
    if fam == "llama":
        out[hf + "self_attn.q_proj.weight"] = halves(t[a + "wq"], H)
        out[hf + "self_attn.k_proj.weight"] = halves(t[a + "wk"], H)
        out[hf + "self_attn.v_proj.weight"] = t[a + "wv"]
    else:
        # HF DeepSeek takes the rope dims interleaved, as we rotate them (its apply_rotary_pos_emb
        # de-interleaves q_pe and k_pe before rotate_half): no permutation.
        if att["q_lora_rank"]:
            out[hf + "self_attn.q_a_proj.weight"] = t[a + "wq_a"]
            out[hf + "self_attn.q_a_layernorm.weight"] = t[a + "q_norm"]
            out[hf + "self_attn.q_b_proj.weight"] = t[a + "wq_b"]
        else:
            out[hf + "self_attn.q_proj.weight"] = t[a + "wq"]
        out[hf + "self_attn.kv_a_proj_with_mqa.weight"] = t[a + "wkv_a"]  # rows: latent, then the rope key
        out[hf + "self_attn.kv_a_layernorm.weight"] = t[a + "kv_norm"]
        out[hf + "self_attn.kv_b_proj.weight"] = t[a + "wkv_b"]
    out[hf + "self_attn.o_proj.weight"] = t[a + "wo"]
    f = ours + "ffn."
    if not moe_layer:
        out[hf + "mlp.gate_proj.weight"] = t[f + "w1"]
        out[hf + "mlp.up_proj.weight"] = t[f + "w3"]
        out[hf + "mlp.down_proj.weight"] = t[f + "w2"]
        return
    moe = c["moe"]
    out[hf + "mlp.gate.weight"] = t[f + "gate"]
    if fam == "deepseek_v3":
        out[hf + "mlp.gate.e_score_correction_bias"] = t.get(ours + "ffn.gate_bias",
                                                             np.zeros(moe["routed"], dtype=np.float32))
    if moe["shared"] > 0:
        for ours_w, name in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            out[hf + f"mlp.shared_experts.{name}.weight"] = t[f + "shared." + ours_w]
    for x in range(moe["routed"]):
        for ours_w, name in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            out[hf + f"mlp.experts.{x}.{name}.weight"] = t[f + f"experts.{x}." + ours_w]


def hf_tensors(t, c, fam):
    """{HF name: float32 array} from {our name: array} (gate biases under '<prefix>ffn.gate_bias')."""
    m, moe, mtp = c["model"], c["moe"], c["mtp"]
    L = m["layers"]
    out = {"model.embed_tokens.weight": t["embed"], "model.norm.weight": t["norm"], "lm_head.weight": t["head"]}
    moe_on = moe["mode"] == "on"
    for l in range(L):
        block_tensors(t, f"layers.{l}.", f"model.layers.{l}.", c, fam, moe_on and l >= moe["dense_layers"], out)
    # DeepSeek-V3's multi-token prediction modules: layer L + d, with its own copies of the shared
    # embedding and head. eh_proj reads [enorm(embedding) | hnorm(hidden)]; ours [hidden | embedding].
    C = m["dim"]
    for d in range(mtp["depth"]):
        p, hf = f"mtp.{d}.", f"model.layers.{L + d}."
        block_tensors(t, p, hf, c, fam, moe_on, out)
        proj = t[p + "proj"]
        out[hf + "eh_proj.weight"] = np.concatenate([proj[:, C:], proj[:, :C]], axis=1)
        out[hf + "enorm.weight"] = t[p + "enorm"]
        out[hf + "hnorm.weight"] = t[p + "hnorm"]
        out[hf + "shared_head.norm.weight"] = t[p + "norm"]
        out[hf + "shared_head.head.weight"] = t["head"]
        out[hf + "embed_tokens.weight"] = t["embed"]
    return {k: np.ascontiguousarray(v, dtype="<f4") for k, v in out.items()}


def write_safetensors(path, tensors, metadata):
    header, offset = {}, 0
    for name in sorted(tensors):
        a = tensors[name]
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in sorted(tensors):
            f.write(tensors[name].tobytes())
        f.flush()
        os.fsync(f.fileno())


def export(ckpt_path, deck, tensors, step, out_dir, tokenizer=None, force=False, drop_mtp=False):
    """Writes out_dir (through out_dir.tmp.PID, renamed at the end); returns a summary line.
    Raises Refused for an option with no counterpart, a missing tokenizer or an existing out_dir.
    drop_mtp: leave the multi-token-prediction modules out (they train the trunk; inference, and HF's
    own DeepSeek-V3 code, uses the main model only)."""
    c = deck_config(deck)
    dropped = c["mtp"]["depth"] if drop_mtp else 0
    if drop_mtp:
        c["mtp"] = {"depth": 0, "weight": 0.0}
    fam = family(c)
    tok = tokenizer if tokenizer is not None else c["data"].get("tokenizer", "")
    if tok and not os.path.isfile(tok):
        raise Refused(f"{tok}: the tokenizer model is missing (expected the file the deck's data line names, "
                      f"or --tokenizer PATH)")
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)) and not force:
        raise Refused(f"{out_dir}: exists (expected a new directory, or --force to replace it)")
    out = hf_tensors(tensors, c, fam)
    cfg = hf_config(c, fam)
    tmp = f"{os.path.abspath(out_dir)}.tmp.{os.getpid()}"
    os.makedirs(tmp)
    try:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        write_safetensors(os.path.join(tmp, "model.safetensors"), out,
                          {"format": "pt", "source": os.path.basename(ckpt_path), "step": step, "family": fam})
        if tok:
            shutil.copyfile(tok, os.path.join(tmp, "tokenizer.model"))
            with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
                json.dump({"tokenizer_class": "LlamaTokenizer", "add_bos_token": False, "add_eos_token": False,
                           "add_prefix_space": False, "legacy": False, "bos_token": "<s>", "eos_token": "</s>",
                           "unk_token": "<unk>", "model_max_length": c["model"]["seq"]}, f, indent=2)
                f.write("\n")
        old = f"{os.path.abspath(out_dir)}.old.{os.getpid()}"
        if os.path.exists(out_dir):
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if os.path.exists(old):
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    n = sum(a.size for a in out.values())
    return (f"{out_dir}: {cfg['architectures'][0]} ({fam}), {len(out)} tensors, {n} parameters (float32), "
            f"step {step} of {ckpt_path}; tokenizer: {tok or 'none (bytes, vocab 256)'}"
            + (f"; {dropped} MTP module(s) left out (--drop-mtp)" if dropped else ""))
