#!/usr/bin/env python3
"""Our export read by a real client: Hugging Face transformers loads OUT_DIR (tools/ckpt export
--format hf) with AutoModelForCausalLM, runs the prompt's tokens (float32, on the CPU, eager
attention; its MoE's grouped_mm takes no float64), and its logits at every position must match ours (xuanxue generate -logits FILE)
within 1e-4 relative (Frobenius norm over all positions). Exit 0 when they do, 1 when not,
2 when the files cannot be read.
    python3 hf_logits.py OUT_DIR OURS.txt"""
import sys
import time

import numpy as np


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    hf_dir, ours_path = sys.argv[1:]
    try:
        lines = [l for l in open(ours_path).read().splitlines() if l.strip()]
        header = lines[0].split()
        if header[:2] != ["#", "tokens"]:
            raise ValueError("the first line is not '# tokens ...'")
        tokens = [int(t) for t in header[2:]]
        ours = np.array([[float(x) for x in l.split()] for l in lines[1:]], dtype=np.float64)
        if ours.shape[0] != len(tokens):
            raise ValueError(f"{ours.shape[0]} rows of logits for {len(tokens)} tokens")
    except (OSError, ValueError, IndexError) as e:
        print(f"hf_logits: {ours_path}: {e} (expected the file of xuanxue generate -logits)", file=sys.stderr)
        return 2

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(4)
    t0 = time.time()
    try:
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    except TypeError:  # transformers 4.x names it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model = model.eval()
    with torch.no_grad():
        theirs = model(torch.tensor([tokens])).logits[0].double().numpy()
    print(f"transformers {transformers.__version__} (torch {torch.__version__}): {type(model).__name__}, "
          f"{sum(p.numel() for p in model.parameters())} parameters, {len(tokens)} tokens, "
          f"{time.time() - t0:.1f} s")
    if theirs.shape != ours.shape:
        print(f"FAIL: their logits are {theirs.shape}, ours {ours.shape}")
        return 1
    rel = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)
    worst = np.abs(ours - theirs).max()
    same_top = int((ours.argmax(1) == theirs.argmax(1)).sum())
    print(f"logits: relative difference {rel:.2e} (allowed 1e-4), largest |ours - theirs| {worst:.2e} of "
          f"|logit| up to {np.abs(theirs).max():.2f}; the same next token at {same_top}/{len(tokens)} positions")
    return 0 if rel <= 1e-4 and np.isfinite(rel) else 1


if __name__ == "__main__":
    sys.exit(main())
