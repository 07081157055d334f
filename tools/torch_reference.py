#!/usr/bin/python3
"""Independent reference for xuanxue's dense model, in PyTorch (float64).

Reads the architecture from the checkpoint's deck attribute and the weights
from its /model group, recomputes the loss and every gradient for the batch in
GRADS (written by tests/parity_dump), and compares:
  loss:      |ours - torch| / |torch|             <= 1e-5
  gradients: ||ours - torch|| / ||torch||, per tensor <= 1e-4
Our side runs in float32, so both bounds leave room for float32 rounding only.

usage: tools/torch_reference.py CHECKPOINT.h5 GRADS.h5
"""
import math
import sys

import h5py
import numpy as np
import torch

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4


def model_config(deck):
    for line in deck.splitlines():
        words = line.split()
        if words and words[0] == "model":
            kv = dict(zip(words[2::2], words[3::2]))
            cfg = {k: int(kv[k]) for k in ("vocab", "dim", "layers", "heads", "ffn", "seq")}
            cfg["rope_theta"] = float(kv.get("rope_theta", 10000.0))
            cfg["norm_eps"] = float(kv.get("norm_eps", 1e-5))
            return cfg
    raise SystemExit("checkpoint deck has no model line")


def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    # x: (B, H, T, D); rotate pairs (2i, 2i+1) by t * theta^(-2i/D), as complex numbers.
    B, H, T, D = x.shape
    freqs = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), freqs)
    rot = torch.polar(torch.ones_like(angles), angles)
    xc = torch.view_as_complex(x.reshape(B, H, T, D // 2, 2).contiguous())
    return torch.view_as_real(xc * rot.to(xc.dtype)).reshape(B, H, T, D)


def loss_fn(p, cfg, inputs, targets):
    B, T = inputs.shape
    C, H = cfg["dim"], cfg["heads"]
    D = C // H
    eps = cfg["norm_eps"]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    x = p["embed"][inputs]
    for l in range(cfg["layers"]):
        pre = f"layers.{l}."
        h = rmsnorm(x, p[pre + "attn_norm"], eps)
        q = (h @ p[pre + "attn.wq"].T).view(B, T, H, D).transpose(1, 2)
        k = (h @ p[pre + "attn.wk"].T).view(B, T, H, D).transpose(1, 2)
        v = (h @ p[pre + "attn.wv"].T).view(B, T, H, D).transpose(1, 2)
        q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(~mask, float("-inf"))
        o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + o @ p[pre + "attn.wo"].T
        h = rmsnorm(x, p[pre + "ffn_norm"], eps)
        a = torch.nn.functional.silu(h @ p[pre + "ffn.w1"].T) * (h @ p[pre + "ffn.w3"].T)
        x = x + a @ p[pre + "ffn.w2"].T
    logits = rmsnorm(x, p["norm"], eps) @ p["head"].T
    return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    torch.set_num_threads(1)
    with h5py.File(sys.argv[1], "r") as ck, h5py.File(sys.argv[2], "r") as gr:
        deck = ck.attrs["deck"]
        deck = deck.decode() if isinstance(deck, bytes) else str(deck)
        cfg = model_config(deck)
        params = {name: torch.tensor(np.asarray(ck["model"][name]), dtype=torch.float64, requires_grad=True)
                  for name in ck["model"]}
        inputs = torch.tensor(np.asarray(gr["inputs"]), dtype=torch.long)
        targets = torch.tensor(np.asarray(gr["targets"]), dtype=torch.long)
        ours_loss = float(np.asarray(gr["loss"])[0])
        ours = {name: np.asarray(gr["grads"][name], dtype=np.float64) for name in gr["grads"]}
    loss = loss_fn(params, cfg, inputs, targets)
    loss.backward()
    ok = True
    rel = abs(ours_loss - loss.item()) / abs(loss.item())
    ok &= rel <= LOSS_RTOL
    print(f"# {'tensor':<22} {'rel_err':>10} {'max_abs_err':>12}   (limit loss {LOSS_RTOL:g}, grads {GRAD_RTOL:g})")
    print(f"  {'loss':<22} {rel:>10.2e} {abs(ours_loss - loss.item()):>12.2e}   ours {ours_loss:.8f} torch {loss.item():.8f}")
    if set(ours) != set(params):
        print("tensor names differ:", sorted(set(ours) ^ set(params)))
        ok = False
    for name in sorted(params):
        ref = params[name].grad.numpy()
        mine = ours[name]
        if mine.shape != ref.shape:
            print(f"  {name:<22} shape {mine.shape} != {ref.shape}")
            ok = False
            continue
        err = np.linalg.norm(mine - ref) / max(np.linalg.norm(ref), 1e-30)
        ok &= err <= GRAD_RTOL
        print(f"  {name:<22} {err:>10.2e} {np.abs(mine - ref).max():>12.2e}{'' if err <= GRAD_RTOL else '   FAILED'}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
