#!/usr/bin/python3
# tools/lab/netsim --project on a synthetic results.json with known answers (no
# runs, no root): the three patterns (allreduce, alltoall = compress topk with
# the default allgather exchange, partitioned = compress ... exchange
# partitioned), their per-rank bytes and seconds at N ranks, the ratio to the
# dense ring, and the wire bytes preferred over the comm bytes. Also the pure
# parts of tools/lab/ablate_lib.py that feed it: case_summary's wire_bytes and
# case_order's abba order. And tools/lab/netsim --nodes without root: the layout,
# config.network, the mpirun flags and --node-exec's placement of the ranks.
#   usage: /usr/bin/python3 tests/test_netsim_project.py   (ctest: netsim_project)
import importlib.machinery
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "lab"))
import ablate_lib  # noqa: E402

loader = importlib.machinery.SourceFileLoader("netsim", os.path.join(ROOT, "tools", "lab", "netsim"))
spec = importlib.util.spec_from_loader("netsim", loader)
netsim = importlib.util.module_from_spec(spec)
loader.exec_module(netsim)

FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILS.append(what)


def close(a, b, what, rel=1e-9):
    check(a is not None and math.isclose(a, b, rel_tol=rel), f"{what}: {a} == {b}")


def stats(x):
    return None if x is None else {"n": 1, "mean": x, "sd": 0.0, "median": x, "min": x, "max": x}


def variant_row(bytes_per_step, rounds, wire=None):
    r = {k: None for k in ablate_lib.METRICS}
    r.update(bytes_per_step=stats(bytes_per_step), rounds_per_step=stats(rounds),
             wire_bytes_per_step=stats(wire), val_loss=stats(3.0), ms_per_step=stats(100.0))
    r.update(cases=1, of=1, lines=[], relative={})
    return r


R, N, B, ALPHA = 4, 512, 10e9 / 8, 5e-6  # measured ranks, projected ranks, 10gbit in bytes/s, 5 us

with tempfile.TemporaryDirectory() as tmp:
    deck = os.path.join(tmp, "base.deck")
    with open(deck, "w") as f:
        f.write("variable steps 10\nsync dense bucket_mb 1\ncompress off\nrun ${steps}\n")
    deck_part = os.path.join(tmp, "part.deck")
    with open(deck_part, "w") as f:
        f.write("sync dense\ncompress topk 0.05 quant int8 exchange partitioned\nrun 10\n")
    variants = [{"name": "dense", "lines": ["sync dense"]},
                {"name": "topk", "lines": ["compress topk 0.01 quant int8"]},
                {"name": "topk-ag", "lines": ["compress topk 0.01 exchange allgather"]},
                {"name": "part", "lines": ["compress topk 0.01 exchange partitioned"]},
                {"name": "local4", "lines": ["sync local 4"]}]
    cfg = {"title": "synthetic", "deck": deck, "variants": variants, "seeds": [1], "ranks": R, "steps": 10,
           "vars": [], "common": [], "eval_every": None, "target_loss": None, "out": tmp}

    # the three patterns, from the variant's lines, --common, or the base deck
    kinds = {v["name"]: netsim.pattern(cfg, v) for v in variants}
    check(kinds == {"dense": "allreduce", "topk": "alltoall", "topk-ag": "alltoall", "part": "partitioned",
                    "local4": "allreduce"}, f"patterns from the variants' lines: {kinds}")
    check(netsim.pattern(dict(cfg, deck=deck_part), {"name": "base", "lines": []}) == "partitioned",
          "partitioned from the base deck's compress line")
    check(netsim.pattern(dict(cfg, deck=deck_part), {"name": "off", "lines": ["compress off"]}) == "allreduce",
          "compress off in a variant wins over the deck's")
    check(netsim.pattern(dict(cfg, common=["compress topk 0.1"]), {"name": "x", "lines": []}) == "alltoall",
          "alltoall from --common")

    # per-rank bytes and seconds at N, on known numbers: the dense buffer 4n = 4e6 B (n = 1e6 floats)
    dense_b, topk_s, part_b = 4e6, 1e4, 2e4
    dense_at_n = 2 * (N - 1) / N * dense_b
    close(netsim.rank_bytes("allreduce", dense_b, R, N), dense_at_n, "allreduce bytes/rank @512 = 2(N-1)/N * 4n")
    close(netsim.rank_bytes("allreduce", 2 * (R - 1) / R * dense_b, R, N, "wire"), dense_at_n,
          "allreduce from wire bytes: D = b*R/(2(R-1))")
    close(netsim.rank_bytes("alltoall", (R - 1) * topk_s, R, N), (N - 1) * topk_s, "alltoall bytes/rank = (N-1)*s")
    o = netsim.PARTITIONED_PEER_BYTES
    part_at = lambda n: (part_b - o * (R - 1)) * ((n - 1) / n) / ((R - 1) / R) + o * (n - 1)
    close(netsim.rank_bytes("partitioned", part_b, R, R), part_b, "partitioned bytes/rank at the measured R = b")
    close(netsim.rank_bytes("partitioned", part_b, R, N), part_at(N),
          "partitioned bytes/rank: payloads as (N-1)/N, headers as N-1")
    check(part_at(N) - o * (N - 1) < 1.4 * part_b,
          f"partitioned payload bytes bounded in N ({part_at(N) - o * (N - 1):.0f} against {part_b:.0f})")
    close(netsim.comm_seconds("allreduce", dense_b, 4, R, N, B, ALPHA), dense_at_n / B + 4 * 2 * (N - 1) * ALPHA,
          "allreduce seconds")
    close(netsim.comm_seconds("alltoall", (R - 1) * topk_s, 1, R, N, B, ALPHA),
          (N - 1) * topk_s / B + (N - 1) * ALPHA, "alltoall seconds")
    close(netsim.comm_seconds("partitioned", part_b, 1, R, N, B, ALPHA), part_at(N) / B + 2 * (N - 1) * ALPHA,
          "partitioned seconds: P/B + rounds*2(N-1)*alpha")
    check(netsim.comm_seconds("alltoall", 1e4, 1, 1, N, B, ALPHA) is None, "alltoall measured on 1 rank: none")

    # the whole table: tools/lab/netsim --project on results.json; the partitioned variant logs wire bytes
    # (2e4), which win over its comm bytes (5e4)
    summary = {"dense": variant_row(dense_b, 4), "topk": variant_row((R - 1) * topk_s, 1),
               "topk-ag": variant_row(999.0, 1, wire=(R - 1) * topk_s), "part": variant_row(5e4, 1, wire=part_b),
               "local4": variant_row(dense_b / 4, 1)}
    with open(os.path.join(tmp, "results.json"), "w") as f:
        json.dump({"tool": "tools/lab/ablate", "config": cfg, "cases": [], "variants": summary}, f)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "lab", "netsim"), "--project",
                        os.path.join(tmp, "results.json"), "--bandwidth", "10gbit", "--alpha-us", "5",
                        "--ranks", f"8,{N}"], capture_output=True, text=True)
    check(p.returncode == 0, f"tools/lab/netsim --project exits 0 ({p.returncode}; {p.stderr.strip()[-300:]})")
    check(os.path.isfile(os.path.join(tmp, "netsim.md")), "netsim.md written")
    rows = {}
    for line in p.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0] in summary:
            rows.setdefault(cells[0], []).append(cells)
    check(all(len(rows.get(v, [])) == 2 for v in summary), "every variant in both tables")
    if not FAILS:
        ms = lambda name: float(rows[name][0][-1])  # comm ms/step @512, first table
        close(ms("dense"), 1e3 * (dense_at_n / B + 8 * (N - 1) * ALPHA), "table: dense comm ms @512", 1e-3)
        close(ms("topk"), 1e3 * ((N - 1) * topk_s / B + (N - 1) * ALPHA), "table: topk comm ms @512", 1e-3)
        close(ms("topk-ag"), ms("topk"), "table: topk-ag from its wire bytes, as topk", 1e-3)
        close(ms("part"), 1e3 * (part_at(N) / B + 2 * (N - 1) * ALPHA), "table: partitioned comm ms @512", 1e-3)
        b = {name: rows[name][1] for name in summary}  # second table: variant, pattern, from, (KB, x dense) per N
        check(b["part"][2] == "wire bytes" and b["dense"][2] == "comm bytes", "bytes from: wire where logged")
        close(float(b["part"][5]), part_at(N) / 1e3, "table: partitioned KB/rank @512", 1e-3)
        ratio = part_at(N) / dense_at_n  # below 1/50 of dense
        check(b["part"][6] == f"{ratio:.3g} (1/{1 / ratio:.0f})" and 1 / ratio > 50,
              f"table: partitioned × dense @512 = {b['part'][6]} (1/{1 / ratio:.0f})")
        check(b["topk"][6].startswith(f"{(N - 1) * topk_s / dense_at_n:.3g}"), f"table: topk × dense @512 {b['topk'][6]}")
        check(b["dense"][4] == "1" and b["dense"][6] == "1", "table: dense × dense = 1")
        check(b["local4"][6] == "0.25", f"table: local4 × dense = {b['local4'][6]}")
        check("4n = 4000 KB the buffer of `dense` (n = 1e+06 floats" in p.stdout, "footer names 4n and n")
        check("partitioned P/B + rounds*2(N-1)*alpha" in p.stdout, "footer has the partitioned formula")

# tools/ablate_lib: wire bytes in case_summary; the abba order
recs = [{"step": s, "loss": 3.0, "ms_per_step": 10.0, "tokens_per_s": 100.0, "comm_bytes": 8, "comm_rounds": 1,
         "comm_wire_bytes": 6} for s in (1, 2, 3, 4)]
s = ablate_lib.case_summary(recs, None)
check(s["wire_bytes"] == 24 and s["wire_bytes_per_step"] == 6 and s["comm_bytes"] == 32, "case_summary wire bytes")
s = ablate_lib.case_summary([{k: v for k, v in r.items() if k != "comm_wire_bytes"} for r in recs], None)
check(s["wire_bytes"] is None and s["wire_bytes_per_step"] is None, "no comm_wire_bytes: wire_bytes None")
order = [(seed, v) for seed, v in ablate_lib.case_order([1, 2, 3], ["A", "B"], "abba")]
check(order == [(1, "A"), (1, "B"), (2, "B"), (2, "A"), (3, "A"), (3, "B")], f"abba, 2 variants: {order}")
order = [v for _, v in ablate_lib.case_order([5, 6], ["A", "B", "C"], "abba")]
check(order == ["A", "B", "C", "C", "B", "A"], f"abba, 3 variants: {order}")
order = [v for _, v in ablate_lib.case_order([5, 6], ["A", "B"], "seed-major")]
check(order == ["A", "B", "A", "B"], f"seed-major: {order}")

# tools/lab/netsim --nodes, the parts that need no root: the layout, what config.network records (no pid),
# the mpirun flags (the wrapper last), and --node-exec's placement (rank r on node r // (n / K)), run with a
# fake `ip` that prints its arguments
import ipaddress  # noqa: E402
nodes = netsim.Nodes(2, 8, ipaddress.IPv4Network("10.201.0.0/24"), "1gbit", "244kb", 100)
check(nodes.layout == [[0, 1, 2, 3], [4, 5, 6, 7]], f"layout node-major: {nodes.layout}")
check(nodes.addr == ["10.201.0.1", "10.201.0.2"] and nodes.bridge_addr == "10.201.0.254",
      f"addresses {nodes.addr}, bridge {nodes.bridge_addr}")
net = nodes.network()
check(net["nodes"] == 2 and net["rate"] == "1gbit" and net["layout"] == nodes.layout
      and str(os.getpid()) not in json.dumps(net), f"network: {net}")
words = netsim.Nodes(2, 8, ipaddress.IPv4Network("10.201.0.0/24"), "1gbit", "244kb", 100).mpirun_args().split()
check(words[-2:] == ["tools/lab/netsim", "--node-exec"] and "10.201.0.0/24" in words and "XXNETSIM_NODES" in words,
      f"mpirun args end with the wrapper: {words}")
check(nodes.env()["PMIX_MCA_ptl_tcp_if_include"] == "10.201.0.0/24" and nodes.env()["UCX_NET_DEVICES"] == "xxnet0",
      "PMIx's server on the subnet, UCX on the node's veth")
with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "ip"), "w") as f:
        f.write("#!/bin/sh\necho \"$@\"\n")
    os.chmod(os.path.join(tmp, "ip"), 0o755)
    placed = []
    for rank in range(8):
        env = dict(os.environ, PATH=tmp + ":" + os.environ.get("PATH", ""), XXNETSIM_NODES="nsA nsB",
                   OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE="8")
        p = subprocess.run([os.path.join(ROOT, "tools", "lab", "netsim"), "--node-exec", "prog", "-x"], env=env,
                           capture_output=True, text=True)
        placed.append(p.stdout.strip())
    check(placed == ["netns exec nsA prog -x"] * 4 + ["netns exec nsB prog -x"] * 4, f"--node-exec: {placed}")
    env = dict(os.environ, PATH=tmp + ":" + os.environ.get("PATH", ""), XXNETSIM_NODES="nsA nsB nsC",
               OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="8")
    p = subprocess.run([os.path.join(ROOT, "tools", "lab", "netsim"), "--node-exec", "prog"], env=env,
                       capture_output=True, text=True)
    check(p.returncode == 2 and "multiple of the nodes" in p.stderr, f"--node-exec, 8 ranks on 3 nodes: exit 2")
shaping = {"rate": "1gbit", "burst": "244kb", "latency": "100ms", "nodes": 2, "layout": nodes.layout,
           "intra_rate": None, "probe": "inter-node 958 Mbit/s"}
with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "base.deck"), "w") as f:
        f.write("sync dense\ncompress off\nrun 10\n")
    doc = {"config": dict(cfg, ranks=8, deck=os.path.join(tmp, "base.deck")), "variants": summary}
    text = netsim.projection_md(doc, shaping, B, ALPHA, [8])
check("2 nodes (ranks 0 1 2 3 | 4 5 6 7), each node's uplink shaped to 1gbit" in text, "projection header: the nodes")

print(f"=== {len(FAILS)} failure(s)")
sys.exit(1 if FAILS else 0)
