#!/usr/bin/python3
"""tools/lab/torch_train.py's model against xuanxue's, on a parity fixture.

tests/parity_dump writes a checkpoint (the deck, the weights, the selection
biases) and xuanxue's loss and gradients for one batch. This check builds the
fixture's model as torch_train.py does and compares, so that a deck option it
reads wrongly (or does not read) fails here instead of training another model:
  parameters: torch_train.layout's names and shapes == the checkpoint's
              (the MoE blocks: dense_layers, layer_freq, MTP)
  loss:       ref.loss_fn with torch_train.routed_moe (its routing: groups,
              topk_groups; its balance loss: over the batch, per sequence,
              seq_aux), in float64 on the checkpoint's weights, against ours:
              |ours - torch| / |torch| <= 1e-5
  aux:        the balance loss alone, the same bound (exactly zero where torch's is)
  gradients:  ||ours - torch|| / ||torch|| per tensor <= 1e-4
  reference:  the same loss and gradients from torch_reference's own moe_ffn
              (every expert on every token), to 1e-10: the routed MoE is the
              reference's model
The bounds are tools/torch_reference.py's for float32 GEMM operands; a 16-bit
fixture is not taken (its bounds belong to the reference's own check).

usage: tests/torch_train_check.py CHECKPOINT.h5 GRADS.h5
"""
import importlib.util
import math
import os
import sys

import h5py
import numpy as np
import torch

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
sys.path.insert(0, TOOLS)
import torch_reference as ref  # noqa: E402

_spec = importlib.util.spec_from_file_location("torch_train", os.path.join(TOOLS, "lab", "torch_train.py"))
tt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tt)

LOSS_RTOL, GRAD_RTOL, SAME_RTOL = 1e-5, 1e-4, 1e-10


def rel(a, b):
    """|a - b| / |b|; 0 when both are zero, inf when only b is."""
    d = np.linalg.norm(np.asarray(a) - np.asarray(b))
    n = np.linalg.norm(np.asarray(b))
    return d / n if n > 0 else (0.0 if d == 0 else math.inf)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    torch.set_num_threads(1)
    with h5py.File(sys.argv[1], "r") as ck, h5py.File(sys.argv[2], "r") as gr:
        cfg, config = ref.model_config(ref.checkpoint_deck(ck))
        if config["precision"]["kind"] != "fp32":
            raise SystemExit(f"torch_train_check: precision {config['precision']['kind']}: fp32 fixtures only")
        weights = {n: np.asarray(ck["model"][n], dtype=np.float64) for n in ck["model"]}
        buffers = {n: torch.tensor(np.asarray(ck["buffers"][n]), dtype=torch.float64)
                   for n in (ck["buffers"] if "buffers" in ck else [])}
        inputs = torch.tensor(np.asarray(gr["inputs"]), dtype=torch.long)
        targets = torch.tensor(np.asarray(gr["targets"]), dtype=torch.long)
        ours_loss = float(np.asarray(gr["loss"])[0])
        ours_aux = float(np.asarray(gr["aux"])[0]) if "aux" in gr else None
        ours = {n: np.asarray(gr["grads"][n], dtype=np.float64) for n in gr["grads"]}
    print(f"# model: {ref.describe(cfg)}")
    ok = True

    # 1. the parameters torch_train.py would train
    mine = {name: shape for name, shape, _ in tt.layout(cfg, 0.02)}
    theirs = {name: w.shape for name, w in weights.items()}
    same_layout = mine == theirs
    ok &= same_layout
    print(f"  {'layout':<22} {len(mine)} tensors, {sum(math.prod(s) for s in mine.values())} parameters; "
          f"xuanxue {len(theirs)}, {sum(math.prod(s) for s in theirs.values())}{'' if same_layout else '   FAILED'}")
    if not same_layout:
        differ = sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))
        for n in differ[:12]:
            print(f"    {n}: torch_train {mine.get(n)} xuanxue {theirs.get(n)}")
        if len(differ) > 12:
            print(f"    ... {len(differ) - 12} more")
        print("FAILED")
        return 1

    # 2. loss, aux and gradients of torch_train's routed MoE, and of the reference's
    def run(moe):
        p = {n: torch.tensor(w, requires_grad=True) for n, w in weights.items()}
        loss, parts = ref.loss_fn(p, buffers, cfg, inputs, targets, {}, moe=moe)
        loss.backward()
        return loss.item(), parts["aux"], {n: (t.grad.numpy() if t.grad is not None else np.zeros(t.shape))
                                           for n, t in p.items()}

    loss, aux, grads = run(tt.routed_moe)
    ref_loss, ref_aux, ref_grads = run(ref.moe_ffn)
    checks = [("loss", rel(ours_loss, loss), LOSS_RTOL, f"ours {ours_loss:.8f} torch_train {loss:.8f}")]
    if ours_aux is not None:
        checks.append(("aux", rel(ours_aux, aux), LOSS_RTOL, f"ours {ours_aux:.8f} torch_train {aux:.8f}"))
    worst = max((rel(ours[n], grads[n]), n) for n in grads)
    checks.append((f"gradients ({len(grads)})", worst[0], GRAD_RTOL, f"worst {worst[1]}"))
    ref_worst = max(rel(grads[n], ref_grads[n]) for n in grads)
    checks.append(("reference loss", rel(loss, ref_loss), SAME_RTOL, f"torch_reference {ref_loss:.12f}"))
    checks.append(("reference aux", rel(aux, ref_aux), SAME_RTOL, f"torch_reference {ref_aux:.12f}"))
    checks.append(("reference gradients", ref_worst, SAME_RTOL, "worst tensor"))
    print(f"# {'check':<22} {'rel_err':>10} {'limit':>8}")
    for name, err, limit, note in checks:
        ok &= err <= limit
        print(f"  {name:<22} {err:>10.2e} {limit:>8.0e}   {note}{'' if err <= limit else '   FAILED'}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
