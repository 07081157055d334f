#!/usr/bin/python3
"""The PyTorch side of `tools/lab/compare`: trains the model of a xuanxue deck
in eager PyTorch (float32, one thread per rank) and prints tokens/s.

The model is tools/torch_reference.py's (MHA or MLA, dense SwiGLU or
DeepSeekMoE: group-limited routing, MoE on every layer_freq-th block, the
balance loss over the batch or per sequence; multi-token prediction), read
from the same deck, run in float32, with one change: the MoE feed-forward here
routes, as eager implementations usually do (loop over the experts, gather the
tokens routed to each, compute, scatter-add with the gate weights), where the
reference runs every expert on every token. tests/torch_train_check.py checks
this model against xuanxue's loss and gradients on the parity fixtures'
weights. Refused by name: a schedule other than cosine, moe capacity_factor
(token dropping). Attention is the reference's masked softmax (torch 1.13 has no
scaled_dot_product_attention).

What matches xuanxue (from the deck): parameter names, shapes and count; the
initialisation scheme (normal(0, init_std); output projections of each
residual branch init_std / sqrt(2 L); norms one), not the values; batch B and
sequence T per rank; AdamW (lr, betas, eps, weight decay on every tensor but
the norms), the warm-up + cosine schedule over the run, gradient clipping by
the global norm; byte tokens (vocab 256) from the deck's corpus, cut into
windows of T + 1 with the last `valid` fraction held out. What does not: the
random draws (initial values, the order of windows).

One rank trains a plain module; --ranks N starts N processes (torch
multiprocessing, spawn), joined by torch.distributed on gloo, the model wrapped
in DistributedDataParallel (its defaults: 25 MB buckets). Each process is
pinned to one core (rank i on the i-th allowed CPU, as mpirun --bind-to core
does) and runs one thread: torch.set_num_threads(1) and OPENBLAS_NUM_THREADS=1.

Timing: the wall time of each step (batch, forward, backward with its
all-reduce, clipping, update) on every rank, after the first --warmup steps;
the slowest rank's sum counts.
  tokens/s = B * T * ranks * timed steps / timed seconds

Prints, on rank 0, a log line every log_every steps (the deck's) on stderr and
at the end one line on stdout, key=value as xuanxue's:
  PERFORMANCE impl=torch steps=N ranks=R timed_steps=S tokens_per_s=X ms_per_step=X final_loss=X params=P ...

usage: tools/lab/torch_train.py DECK [--ranks N] [--steps N] [--warmup N] [-var NAME VALUE]...
"""
import os
import sys

# One BLAS thread per rank, before torch (and its OpenBLAS) loads.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import math  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # (this file is in tools/lab/)
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
import torch_reference as ref  # noqa: E402  (the model: rmsnorm, rope, mha, mla, swiglu, block, loss_fn)
import xxpy.deck  # noqa: E402

# ----------------------------------------------------------------------------
# the deck, as the binary resolves it (xuanxue -print-config json)


def train_config(phases):
    """Data, optimizer, schedule and seed at the first `run` of the resolved deck; runs: the steps of every run."""
    c = phases[0]["config"]
    d, o, s = c["data"], c["optimizer"], c["schedule"]
    if s["kind"] != "cosine":
        raise SystemExit(f"torch_train: schedule {s['kind']}: only cosine is implemented here (expected schedule cosine)")
    e = c["moe"]
    if e["mode"] == "on" and e["capacity_factor"] > 0:
        raise SystemExit(f"torch_train: moe capacity_factor {e['capacity_factor']:g}: dropping tokens past an "
                         "expert's capacity is not implemented here (expected no capacity_factor: dropless)")
    return {"seed": c["seed"], "data": d["path"], "batch": d["batch"], "valid": float(d["valid"]),
            "lr": o["lr"], "beta1": o["beta1"], "beta2": o["beta2"], "eps": o["eps"],
            "weight_decay": o["weight_decay"], "clip": o["clip"], "warmup": s["warmup"], "min_lr": s["min_lr"],
            "total": s["total"], "log_every": c["output"]["log_every"], "init_std": c["model"]["init_std"],
            "runs": sum(p["steps"] for p in phases)}


def learning_rate(c, step):
    """As src/train/schedule.cpp's cosine: linear warm-up, then cosine to min_lr over the run."""
    if c["warmup"] > 0 and step <= c["warmup"]:
        return c["lr"] * step / c["warmup"]
    span = c["total"] - c["warmup"]
    if span <= 0:
        return c["lr"]
    progress = min(max((step - c["warmup"]) / span, 0.0), 1.0)
    return c["min_lr"] + 0.5 * (c["lr"] - c["min_lr"]) * (1.0 + math.cos(math.pi * progress))


# ----------------------------------------------------------------------------
# parameters: the names, shapes and initial scale of src/model/params.cpp


def layout(cfg, init_std):
    """[(name, shape, std)], std None for a norm (initialised to one)."""
    C, V, L, H = cfg["dim"], cfg["vocab"], cfg["layers"], cfg["heads"]
    a, m = cfg["attention"], cfg["moe"]
    out_std = init_std / math.sqrt(2.0 * L)
    t = []

    def block(p, is_moe):
        t.append((p + "attn_norm", (C,), None))
        if a["kind"] != "mla":
            for w in ("wq", "wk", "wv"):
                t.append((p + "attn." + w, (C, C), init_std))
            t.append((p + "attn.wo", (C, C), out_std))
        else:
            qk = a["qk_nope_dim"] + a["rope_dim"]
            if a["q_lora_rank"] == 0:
                t.append((p + "attn.wq", (H * qk, C), init_std))
            else:
                t.append((p + "attn.wq_a", (a["q_lora_rank"], C), init_std))
                t.append((p + "attn.q_norm", (a["q_lora_rank"],), None))
                t.append((p + "attn.wq_b", (H * qk, a["q_lora_rank"]), init_std))
            t.append((p + "attn.wkv_a", (a["kv_lora_rank"] + a["rope_dim"], C), init_std))
            t.append((p + "attn.kv_norm", (a["kv_lora_rank"],), None))
            t.append((p + "attn.wkv_b", (H * (a["qk_nope_dim"] + a["v_dim"]), a["kv_lora_rank"]), init_std))
            t.append((p + "attn.wo", (C, H * a["v_dim"]), out_std))
        t.append((p + "ffn_norm", (C,), None))
        if not is_moe:
            Fd = cfg["ffn"]
            t.extend([(p + "ffn.w1", (Fd, C), init_std), (p + "ffn.w3", (Fd, C), init_std),
                  (p + "ffn.w2", (C, Fd), out_std)])
            return
        Fm = m["ffn"]
        t.append((p + "ffn.gate", (m["routed"], C), init_std))
        if m["shared"] > 0:
            S = m["shared"] * Fm
            t.extend([(p + "ffn.shared.w1", (S, C), init_std), (p + "ffn.shared.w3", (S, C), init_std),
                  (p + "ffn.shared.w2", (C, S), out_std)])
        for e in range(m["routed"]):
            q = f"{p}ffn.experts.{e}."
            t.extend([(q + "w1", (Fm, C), init_std), (q + "w3", (Fm, C), init_std), (q + "w2", (C, Fm), out_std)])

    t.append(("embed", (V, C), init_std))
    for l in range(L):
        block(f"layers.{l}.", ref.is_moe_layer(cfg, l))  # past dense_layers, every layer_freq-th block
    t.append(("norm", (C,), None))
    if not cfg.get("tie_embeddings"):  # tied: 'embed' is the head too
        t.append(("head", (V, C), init_std))
    for d in range(cfg["mtp"]["depth"]):
        p = f"mtp.{d}."
        t.extend([(p + "hnorm", (C,), None), (p + "enorm", (C,), None), (p + "proj", (C, 2 * C), init_std)])
        block(p, ref.is_moe_layer(cfg, L + d))  # MTP module d is block L + d
        t.append((p + "norm", (C,), None))
    return t


# ----------------------------------------------------------------------------
# the routed MoE (replaces the reference's every-expert-on-every-token one)


def select_experts(key, m):
    """idx (N, k): the k experts of the largest key (N, E) = score + bias.
    Group-limited (groups G > 1, DeepSeek-V2's group_limited_greedy, V3's
    noaux_tc): the experts are G groups of E/G in index order; a group's value
    is its largest key (softmax gate) or the sum of its two largest (sigmoid);
    the topk_groups groups of the largest values stay and the k come from
    them, as tools/torch_reference.py select_experts and kernels/moe.h
    router_topk_grouped define it. Written as eager users write it (HF's
    DeepSeek codes): top-k of the group values, the other groups masked, top-k.
    Ties go wherever torch.topk puts them (xuanxue: the lower index)."""
    N, E = key.shape
    G, k = m["groups"], m["topk"]
    if G > 1:
        grouped = key.view(N, G, E // G)
        if m["gate"] == "sigmoid":
            group_value = grouped.topk(2, dim=-1).values.sum(-1)  # (N, G)
        else:
            group_value = grouped.max(dim=-1).values  # (N, G)
        kept = group_value.topk(m["topk_groups"], dim=-1).indices  # (N, g)
        mask = torch.zeros(N, G, dtype=torch.bool).scatter(1, kept, True)
        key = key.masked_fill(~mask.repeat_interleave(E // G, dim=1), float("-inf"))
    return key.topk(k, dim=-1).indices


def routed_moe(p, buffers, pre, h, cfg, stats):
    """DeepSeekMoE on h (B, T, C): top-k of the gate (plus the selection bias,
    if any; inside the token's best expert groups under groups G > 1), weights
    from the gate alone; shared experts on every token; each routed expert on
    the tokens routed to it (one gather of the tokens sorted by expert, a loop
    over the experts, one scatter-add). Returns (out, aux): the balance loss
    over the batch (balance aux, aux_scope batch) or per sequence (aux_scope
    sequence, or balance bias's seq_aux; torch_reference.sequence_balance_loss)."""
    m = cfg["moe"]
    B, T, C = h.shape
    E, k = m["routed"], m["topk"]
    x = h.reshape(B * T, C)  # (N, C)
    N = x.shape[0]
    logits = x @ p[pre + "ffn.gate"].T  # (N, E)
    s = torch.sigmoid(logits) if m["gate"] == "sigmoid" else torch.softmax(logits, dim=-1)
    bias = buffers.get(pre + "ffn.gate_bias")
    with torch.no_grad():
        idx = select_experts(s if bias is None else s + bias, m)  # (N, k)
    w = torch.gather(s, 1, idx)  # (N, k)
    if m["gate"] == "sigmoid":
        w = w / w.sum(-1, keepdim=True)
    if m["route_scale"] != 1.0:
        w = w * m["route_scale"]
    with torch.no_grad():
        flat = idx.reshape(-1)  # (N*k,) expert of each (token, slot)
        order = flat.argsort()  # (token, slot) pairs grouped by expert
        token = order // k  # their tokens
        counts = torch.bincount(flat, minlength=E)  # (E,) tokens per expert
    xs = x.index_select(0, token)  # (N*k, C)
    ys = []
    for e, xe in enumerate(xs.split(counts.tolist())):
        q = f"{pre}ffn.experts.{e}."
        ys.append(ref.swiglu(xe, p[q + "w1"], p[q + "w3"], p[q + "w2"]))  # an idle expert runs on (0, C)
    y = torch.cat(ys) * w.reshape(-1).index_select(0, order).unsqueeze(1)  # (N*k, C)
    out = torch.zeros_like(x).index_add(0, token, y.to(x.dtype))  # autocast: the experts ran in bf16
    if m["shared"] > 0:
        out = out + ref.swiglu(x, p[pre + "ffn.shared.w1"], p[pre + "ffn.shared.w3"], p[pre + "ffn.shared.w2"])
    aux = torch.zeros((), dtype=x.dtype)
    if m["balance"] == "aux" and m["aux_scope"] == "batch":
        f = (E / (k * N)) * counts.to(x.dtype)  # a constant: no gradient
        aux = m["balance_coef"] * (f * s.mean(0)).sum()
    alpha = ref.sequence_alpha(m)  # aux_scope sequence's balance_coef, or balance bias's seq_aux; 0: none
    if alpha > 0:
        with torch.no_grad():
            chosen = torch.zeros(N, E, dtype=x.dtype).scatter(1, idx, 1.0)  # (N, E) 0/1, a constant
        aux = ref.sequence_balance_loss(s, chosen, B, T, k, alpha, m["gate"] == "sigmoid")
    stats.setdefault("load", {})[pre] = counts
    return out.view(B, T, C), aux


class Model(nn.Module):
    """The parameters in xuanxue's order; forward is torch_reference.loss_fn."""

    def __init__(self, cfg, init_std, seed):
        super().__init__()
        self.cfg = cfg
        self.tensors = layout(cfg, init_std)
        g = torch.Generator().manual_seed(seed)
        ps = []
        for _, shape, std in self.tensors:
            w = torch.empty(shape, dtype=torch.float32)
            ps.append(nn.Parameter(w.fill_(1.0) if std is None else w.normal_(0.0, std, generator=g)))
        self.weights = nn.ParameterList(ps)
        self.names = [n for n, _, _ in self.tensors]
        m = cfg["moe"]
        self.gate_bias = {}  # the selection biases of balance bias (updated outside autograd)
        if m["mode"] == "on" and m["balance"] == "bias":
            self.gate_bias = {n[:-len("gate")] + "gate_bias": torch.zeros(m["routed"])
                              for n in self.names if n.endswith("ffn.gate")}
        self.stats, self.parts = {}, {}

    def forward(self, inputs, targets):
        p = dict(zip(self.names, self.weights))
        self.stats = {}
        loss, self.parts = ref.loss_fn(p, self.gate_bias, self.cfg, inputs, targets, self.stats, moe=routed_moe)
        return loss


def update_gate_bias(model, gamma, world):
    """balance bias: each layer's selection bias moves by gamma towards the mean
    load, from the global load (as src/model/ffn.cpp update_bias)."""
    loads = model.stats.get("load", {})
    if not model.gate_bias or not loads:
        return
    keys = sorted(loads)
    all_loads = torch.stack([loads[k].to(torch.float64) for k in keys])
    if world > 1:
        dist.all_reduce(all_loads)
    for k, load in zip(keys, all_loads):
        model.gate_bias[k + "ffn.gate_bias"] += gamma * torch.sign(load.mean() - load).to(torch.float32)


# ----------------------------------------------------------------------------
# data: byte windows of T + 1, the last `valid` fraction held out


class Windows:
    """Train windows t*T .. t*T+T of the corpus, a fresh permutation each epoch
    (the same on every rank), rank r taking positions r, r+R, r+2R, ..."""

    def __init__(self, path, T, B, valid, rank, world, seed):
        with open(path, "rb") as f:
            data = np.frombuffer(f.read(), dtype=np.uint8)
        total = (len(data) - 1) // T
        n_valid = max(1, round(total * valid))
        self.windows = total - n_valid
        if self.windows < B * world:
            raise SystemExit(f"torch_train: {path}: {self.windows} training windows of {T} tokens, fewer than "
                             f"batch {B} x {world} ranks")
        self.data = torch.from_numpy(data[: total * T + 1].astype(np.int64))
        self.T, self.B, self.rank, self.world = T, B, rank, world
        self.g = torch.Generator().manual_seed(seed)
        self.perm, self.pos = torch.randperm(self.windows, generator=self.g), 0
        self.offsets = torch.arange(T + 1)

    def next(self):
        per_rank = self.windows // self.world
        if self.pos + self.B > per_rank:
            self.perm, self.pos = torch.randperm(self.windows, generator=self.g), 0
        w = self.perm[self.rank + self.world * torch.arange(self.pos, self.pos + self.B)]  # (B,)
        self.pos += self.B
        tok = self.data[(w * self.T).unsqueeze(1) + self.offsets]  # (B, T+1)
        return tok[:, :-1], tok[:, 1:]


# ----------------------------------------------------------------------------
# main training loop (one process per rank)


def train(rank, world, port, args, deck, cpus):
    torch.set_num_threads(1)
    if cpus:
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    if world > 1:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cfg = ref.model_of(deck[0]["config"])
    tc = train_config(deck)
    B, T = tc["batch"], cfg["seq"]
    torch.manual_seed(tc["seed"] + rank)
    model = Model(cfg, tc["init_std"], tc["seed"])
    params = list(model.weights)
    n_params = sum(w.numel() for w in params)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model  # broadcasts rank 0's weights
    decay = [w for (_, _, std), w in zip(model.tensors, params) if std is not None]
    no_decay = [w for (_, _, std), w in zip(model.tensors, params) if std is None]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tc["lr"], betas=(tc["beta1"], tc["beta2"]), eps=tc["eps"])
    data_path = tc["data"] if os.path.isabs(tc["data"]) else os.path.join(os.getcwd(), tc["data"])
    windows = Windows(data_path, T, B, tc["valid"], rank, world, tc["seed"])
    if rank == 0:
        print(f"# torch {torch.__version__}, {world} rank(s) x {torch.get_num_threads()} thread(s), "
              f"{'DDP on gloo' if world > 1 else 'no process group'}; model: {ref.describe(cfg)}; "
              f"{n_params} parameters; batch {B} x seq {T} per rank", file=sys.stderr, flush=True)

    autocast = ((lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.autocast == "bf16"
                else contextlib.nullcontext)
    timed_s, timed_steps, interval_s, loss = 0.0, 0, 0.0, None
    for step in range(1, args.steps + 1):
        # TRAINING STEP BEGIN
        t0 = time.perf_counter()
        inputs, targets = windows.next()  # (B, T) each
        lr = learning_rate(tc, step)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        with autocast():  # bf16: torch.autocast, what a PyTorch user would try; fp32: nothing
            loss = net(inputs, targets)
        loss.backward()  # DDP: the gradient all-reduce runs inside
        norm = torch.nn.utils.clip_grad_norm_(params, tc["clip"]) if tc["clip"] > 0 else torch.zeros(())
        opt.step()
        if model.gate_bias:
            update_gate_bias(model, cfg["moe"]["balance_coef"], world)
        dt = time.perf_counter() - t0
        # TRAINING STEP END
        interval_s += dt
        if step > args.warmup:
            timed_s += dt
            timed_steps += 1
        if rank == 0 and (step % tc["log_every"] == 0 or step == args.steps):
            n = tc["log_every"] if step % tc["log_every"] == 0 else step % tc["log_every"]
            print(f"step {step:>6}/{args.steps} | loss {loss.item():.4f} | lr {lr:.2e} | norm {norm.item():.3f} | "
                  f"{1e3 * interval_s / n:.1f} ms | {B * T * world * n / interval_s:.0f} tok/s",
                  file=sys.stderr, flush=True)
            interval_s = 0.0
        if not math.isfinite(loss.item()):
            raise SystemExit(f"torch_train: step {step}: loss is {loss.item()}")

    final = torch.tensor([loss.item(), timed_s], dtype=torch.float64)
    if world > 1:  # the mean loss over ranks, the slowest rank's time
        losses = final[:1].clone()
        dist.all_reduce(losses)
        slowest = final[1:].clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        final = torch.cat([losses / world, slowest])
    if rank == 0:
        tok_s = B * T * world * timed_steps / final[1].item() if timed_steps else 0.0
        ms = 1e3 * final[1].item() / timed_steps if timed_steps else 0.0
        print(f"PERFORMANCE impl=torch steps={args.steps} ranks={world} timed_steps={timed_steps} "
                      f"tokens_per_s={tok_s:.0f} ms_per_step={ms:.2f} final_loss={final[0].item():.6f} "
                      f"params={n_params} threads={torch.get_num_threads()} torch={torch.__version__} "
              f"precision={args.autocast or 'fp32'}", flush=True)
    if world > 1:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    p = argparse.ArgumentParser(prog="tools/lab/torch_train.py", description=__doc__.split("\n\n")[0])
    p.add_argument("deck", help="a xuanxue deck, e.g. input/tiny.deck (paths in it relative to the working directory)")
    p.add_argument("--ranks", type=int, default=1, help="processes, one core and one thread each (default 1)")
    p.add_argument("--steps", type=int, default=None, help="steps (default: the deck's `run` total)")
    p.add_argument("--warmup", type=int, default=None,
                   help="first steps left out of the timing (default: the deck's log_every, as tools/bench drops "
                        "xuanxue's first log interval)")
    p.add_argument("--autocast", choices=["bf16"], default=None,
                   help="run the forward under torch.autocast('cpu', dtype=torch.bfloat16) (default: float32)")
    p.add_argument("-var", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="deck variable, as xuanxue's -var")
    args = p.parse_args(argv)
    # --steps is the deck's ${steps}, as tools/bench gives xuanxue -var steps: the schedule's total
    # (the sum of the runs when the deck gives none) is then the same on both sides.
    variables = list(args.var) + ([("steps", str(args.steps))] if args.steps is not None else [])
    try:
        deck = xxpy.deck.phases(args.deck, variables)  # every phase, resolved: picklable for the ranks
    except xxpy.deck.DeckError as e:
        raise SystemExit(f"torch_train: {e}")
    tc = train_config(deck)
    if args.steps is None:
        args.steps = tc["runs"]
    if args.warmup is None:
        args.warmup = tc["log_every"]
    if args.steps < 1 or args.ranks < 1 or args.warmup < 0:
        p.error("--steps and --ranks must be at least 1, --warmup at least 0")
    if args.steps <= args.warmup:
        p.error(f"--steps {args.steps}: the first {args.warmup} steps are warm-up and not timed "
                f"(expected --steps > {args.warmup})")
    cpus = sorted(os.sched_getaffinity(0))
    if args.ranks > len(cpus):
        print(f"# warning: {args.ranks} ranks on {len(cpus)} cores share cores (for testing, not timing)",
              file=sys.stderr)
    if args.ranks == 1:
        train(0, 1, 0, args, deck, cpus)
    else:
        mp.spawn(train, args=(args.ranks, free_port(), args, deck, cpus), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
