#!/usr/bin/env python3
"""A real client's files, imported: Hugging Face transformers writes a model directory the way a
user's download looks (save_pretrained of its own DeepseekV3ForCausalLM, built from a tiny random
config, and the tokenizer saved beside it), for `init hf DIR` to read (tools/device/checks.sh, stage
hf). The machine that runs it has transformers; this one (the build machine) does not.

    python3 hf_client.py make DIR TOKENIZER [--yarn]
        DIR: config.json + model.safetensors (float32) + tokenizer.json and its config files.
        TOKENIZER: a tokenizer.json (tests/data/hf_tokenizer's, DeepSeek-V3's configuration),
        loaded by transformers and saved again by it; the model's vocab is its length. The
        model: MLA with a query latent, 8 routed experts in 4 groups of which 2 are kept
        (noaux_tc), 1 shared, first layer dense, routed_scaling_factor 1.5, a random selection
        bias; with --yarn, YaRN (factor 4 over 128 positions, mscale 1, mscale_all_dim 1).
    python3 hf_client.py ids DIR OURS.txt TEXT_FILE
        Our ids (the '# tokens' line of `xuanxue generate -tokenizer DIR/tokenizer.json -logits
        OURS.txt`, on TEXT_FILE's text) against transformers' tokenizer from DIR, without special
        tokens (ours adds no BOS: src/data/hf_tokenizer.h). Then decode: our ids back to the text.
Exit 0 when it holds, 1 when not, 2 when the files cannot be read."""
import json
import os
import sys


def make(out_dir, tokenizer_file, yarn):
    import torch
    import transformers
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(7)
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file)
    cfg = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
               n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=1.5,
               norm_topk_prob=True, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48,
               qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=2048,
               rms_norm_eps=1e-6, initializer_range=0.2, tie_word_embeddings=False)
    if yarn:
        scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                   "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
        major = int(transformers.__version__.split(".")[0])
        if major >= 5:
            cfg["rope_parameters"] = {**scaling, "rope_theta": 10000.0}
        else:
            cfg["rope_scaling"] = {**scaling, "type": "yarn"}
    config = DeepseekV3Config(**cfg)
    model = DeepseekV3ForCausalLM(config).float().eval()
    # transformers starts the selection bias at zero: a random one makes the import's bias matter
    with torch.no_grad():
        for name, buf in list(model.named_buffers()) + list(model.named_parameters()):
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.3 * torch.randn_like(buf))
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    files = sorted(os.listdir(out_dir))
    print(f"transformers {transformers.__version__}: {type(model).__name__}, vocab {len(tok)}, "
          f"{sum(p.numel() for p in model.parameters())} parameters{', YaRN' if yarn else ''}; {out_dir}: "
          f"{' '.join(files)}")
    return 0


def ids(out_dir, ours_path, text_path):
    try:
        header = open(ours_path).readline().split()
        if header[:2] != ["#", "tokens"]:
            raise ValueError("the first line is not '# tokens ...'")
        ours = [int(t) for t in header[2:]]
        text = open(text_path, encoding="utf-8").read()
    except (OSError, ValueError) as e:
        print(f"hf_client: {e}", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out_dir)
    theirs = tok.encode(text, add_special_tokens=False)
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    same = ours == theirs
    print(f"ids: ours {len(ours)}, transformers' {len(theirs)} on {len(text.encode())} bytes of text: "
          f"{'identical' if same else f'differ from position {first}: ours {ours[first:first + 5]}, theirs {theirs[first:first + 5]}'}")
    back = tok.decode(ours, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    print(f"decode: our ids through transformers back to the text: {'exact' if back == text else 'NOT exact'}")
    return 0 if same and back == text else 1


def main(argv):
    if len(argv) >= 3 and argv[0] == "make":
        return make(argv[1], argv[2], "--yarn" in argv[3:])
    if len(argv) == 4 and argv[0] == "ids":
        return ids(*argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
