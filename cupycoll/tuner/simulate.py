"""``python -m cupycoll simulate``: predicted time and traffic per algorithm, P = 2 .. 1,024.

The sparse family is priced by exactly what ``auto`` uses (each algorithm's traffic model,
:mod:`cupycoll.tuner.predict`'s work model, one :class:`Profile`), with the profile built from a
named network and a compute profile. The top-k family is priced from its documented volumes
and latencies (docs/topk.md; the Ok-Topk paper's Table 1): words received per rank (1 word =
4 bytes) times beta, messages on the critical path times alpha, plus one selection pass over n.

Networks (``NETWORKS``): ``nvlink`` one node of 8 GPUs over NVLink; ``ib400`` 8 GPUs per node
(NVLink inside) over 400 Gb/s InfiniBand, one NIC per GPU; ``eth100`` one GPU per node over
100 Gb/s Ethernet; ``machine`` this machine's profile (``CUPYCOLL_PROFILE``), to validate the
models against measurements at P <= 8. Across nodes the slower link prices the share of an
all-to-all's bytes that leaves the node, and all of a native collective's (rings cross nodes);
the node-aware ``hierarchical`` prices its node phases on the intra-node link and its rails on
the inter-node link (``Profile.links``), ranks r // ranks_per_node sharing a node, and so does
Ok-Topk's two-level allgather phase (node gather and broadcast inside, leaders across);
a native collective's round costs 2 ceil(log2 P) latencies (trees), each extra point-to-point
message of a round a quarter of one (injection).
Stragglers: ``--skew s`` gives rank 0 (1 + s) times the mean nnz; the slowest rank's time is
reported (the models price the ranks with the fewest and the most entries).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Any

from .._arguments import checked, listed, made_folder, one_of, output_file, parse_length, plot_file
from .._registry import priced, record
from ..comm._topology import Topology
from ..sparse._cost import Shape, validation_cost
from ..sparse.auto import choose
from ..topk._oktopk_nodes import OPS, allgather_nodes_cost, two_level
from ..topk._oktopk_phases import block_sizes
from ..wire._model import expected_index_nbytes
from ..wire._pack import Wire
from .predict import predict
from .profile import Profile, load_profile

__all__ = ["NETWORKS", "GPU", "network_profile", "sparse_rows", "topk_rows", "TOPK_MODELS",
           "add_arguments", "run"]


@dataclasses.dataclass(frozen=True)
class Network:
    """Per-message latency (s) and per-byte time (s/B) inside a node and between nodes."""

    ranks_per_node: int
    alpha_intra: float
    beta_intra: float
    alpha_inter: float
    beta_inter: float
    about: str
    max_ranks: int | None = None


#: named networks (published link rates; latencies typical of NCCL/UCX point-to-point).
NETWORKS = {
    "nvlink": Network(8, 3e-6, 1 / 150e9, 3e-6, 1 / 150e9,
                      "one node of 8 GPUs, NVLink (~150 GB/s per GPU per direction)", 8),
    "ib400": Network(8, 3e-6, 1 / 150e9, 6e-6, 1 / 50e9,
                     "8 GPUs per node on NVLink, 400 Gb/s InfiniBand NIC per GPU (50 GB/s)"),
    "eth100": Network(1, 20e-6, 1 / 12.5e9, 20e-6, 1 / 12.5e9,
                      "one GPU per node, 100 Gb/s Ethernet (12.5 GB/s, ~20 us per message)"),
}

#: a GPU compute profile: seconds per unit of local work (a ~1 TB/s device: merges ~2
#: G entries/s, copies ~250 G elements/s, dense passes ~50 G elements/s) and per-call overheads
#: (kernel launches and host synchronisations of each algorithm's steps).
GPU = Profile("gpu", 0.0, 0.0, 0.0, 0.0,
              {"merge": 5e-10, "row": 4e-12, "dense": 2e-11, "scan": 1e-11, "code": 2e-11},
              fixed={"allgather": 60e-6, "dense": 60e-6, "mask": 100e-6, "split": 150e-6,
               "recursive_doubling": 80e-6, "hierarchical": 150e-6, "allreduce": 10e-6})

#: top-k: (words received per rank, messages on the critical path) of (P, k, n), docs/topk.md.
TOPK_MODELS = {
    "oktopk": lambda p, k, n: (6 * k * (p - 1) / p, 2 * p + 2 * math.log2(p)),
    "topka": lambda p, k, n: (2 * k * (p - 1), math.log2(p)),
    "gaussiank": lambda p, k, n: (2 * k * (p - 1), math.log2(p)),
    "gtopk": lambda p, k, n: (4 * k * math.ceil(math.log2(p)), 2 * math.log2(p)),
    "dense": lambda p, k, n: (2 * n * (p - 1) / p, 2 * math.log2(p)),
}


def network_profile(name: str, size: int, compute: Profile = GPU) -> Profile:
    """The profile of ``size`` ranks on network ``name`` with ``compute``'s gamma and fixed."""
    if name == "machine":
        return load_profile(size=size)
    net = NETWORKS[name]
    if size <= net.ranks_per_node:
        a_p2p = a_nat = net.alpha_intra
        b_p2p = b_nat = net.beta_intra
    else:
        off_node = (size - net.ranks_per_node) / (size - 1)
        a_p2p = a_nat = net.alpha_inter
        b_p2p = max(off_node * net.beta_inter, (1 - off_node) * net.beta_intra)
        b_nat = net.beta_inter
    # a native collective's round: a tree/recursive latency of 2 ceil(log2 P) steps; every
    # point-to-point message past a round's first costs a quarter of a latency (injection)
    steps = 2 * max(math.ceil(math.log2(size)), 1)
    # the node-aware algorithms price each phase on its own link (Profile.links)
    links = {kind: {"alpha_p2p": a, "beta_p2p": b, "alpha_msg": a / 4}
             for kind, a, b in (("intra", net.alpha_intra, net.beta_intra),
                                ("inter", net.alpha_inter, net.beta_inter))}
    return Profile(f"{name}-P{size}", a_p2p, b_p2p, a_nat * steps, b_nat, compute.gamma,
                   alpha_msg=a_p2p / 4, fixed=compute.fixed, links=links)


def _fits(net: str, size: int) -> bool:
    limit = NETWORKS[net].max_ranks if net in NETWORKS else None
    return limit is None or size <= limit


def _shape(size: int, n: int, density: float, width: int, skew: float,
           ranks_per_node: int | None = None, wire: Wire = Wire(), output: str = "sparse"
           ) -> Shape:
    k = max(1, int(round(density * n)))
    nnz = [k] * size
    nnz[0] = min(n, int(round(k * (1 + skew))))
    nodes = tuple(r // ranks_per_node for r in range(size)) if ranks_per_node else None
    return Shape(size, n, width, 4, 4, tuple(nnz), nodes=nodes, wire=wire, output=output)


def _volume(name: str, shape: Shape, profile: Profile | None) -> int:
    """Most bytes a rank (the first or the last) receives, validation included (priced with
    ``profile`` where an algorithm's messages depend on it: hierarchical's rails, split's
    dense or sparse regions)."""
    model = record("sparse", name).cost
    return max(validation_cost(shape.size).add(model(shape, r, profile)).bytes_received
               for r in sorted({0, shape.size - 1}))


def wire_name(wire: Wire) -> str:
    return wire.name + (f"+{wire.values}" if wire.values else "")


def sparse_rows(sizes: list[int], networks: list[str], n: int, density: float, width: int,
                skew: float = 0.0, wires: tuple = (Wire(),), outputs: tuple = ("sparse",)
                ) -> list[dict[str, Any]]:
    """One row per (P, network, wire format, output, algorithm) of the sparse family, plus
    auto's pick (per wire format and output: "sparse" entries or the "dense" n-vector)."""
    return [row for wire in wires for output in outputs
            for row in _sparse_rows(sizes, networks, n, density, width, skew, wire, output)]


def _sparse_rows(sizes: list[int], networks: list[str], n: int, density: float, width: int,
                 skew: float, wire: Wire, output: str = "sparse") -> list[dict[str, Any]]:
    rows, algorithms = [], priced("sparse")
    for size in sizes:
        for net in (net for net in networks if _fits(net, size)):
            shape = _shape(size, n, density, width, skew,
                           NETWORKS[net].ranks_per_node if net in NETWORKS else None, wire,
                           output)
            profile = network_profile(net, size)
            volume = {name: _volume(name, shape, profile) for name in algorithms}
            times = {name: predict(name, shape, profile) for name in algorithms}
            best = choose(shape, profile)  # auto's own pick (its shape class; P = 1: allgather)
            for name, seconds in times.items():
                rows.append({"family": "sparse", "algorithm": name, "P": size, "network": net,
                             "predicted_s": seconds, "bytes_per_rank": volume[name], "n": n,
                             "density": density, "width": width, "skew": skew,
                             "auto_pick": name == best, "wire": wire_name(wire),
                             "output": output})
    return rows


def topk_bytes(name: str, words: float, k: int, n: int, wire: Wire) -> float:
    """Bytes of ``words`` (half indices, half values; dense: values only) on ``wire``: values
    of 2 bytes when rounded, indices coded at the expected bytes per index at density k/n."""
    if name == "dense":
        return 4 * words
    per_value = 2 if wire.values else 4
    per_index = expected_index_nbytes(k, n, 4) / k if wire.compact else 4
    return words / 2 * (per_value + per_index)


def topk_rows(sizes: list[int], networks: list[str], n: int, density: float,
              wires: tuple = (Wire(),)) -> list[dict[str, Any]]:
    """One row per (P, network, wire format, algorithm) of the top-k family (k = density *
    n); the compact wire adds the coding of about two indices per index word received."""
    k, rows = max(1, int(round(density * n))), []
    for wire in wires:
        for size in sizes:
            for net in (net for net in networks if _fits(net, size)):
                profile = network_profile(net, size)
                select = profile.gamma.get("scan", 0.0) * n
                per_node = NETWORKS[net].ranks_per_node if net in NETWORKS else 1
                for name, model in TOPK_MODELS.items():
                    words, messages = model(size, k, n)
                    nbytes = topk_bytes(name, words, k, n, wire)
                    coding = (profile.gamma.get("code", 0.0) * words
                              if wire.compact and name != "dense" else 0.0)
                    link_time = profile.alpha_p2p * messages + profile.beta_p2p * nbytes
                    if name == "oktopk" and per_node > 1:
                        link_time, nbytes, messages = oktopk_nodes_price(
                            size, k, n, per_node, profile, wire, (link_time, nbytes, messages))
                    seconds = profile.fixed.get("allreduce", 0.0) + select + coding + link_time
                    rows.append({"family": "topk", "algorithm": name, "P": size,
                                 "network": net, "predicted_s": seconds,
                                 "bytes_per_rank": int(nbytes), "n": n, "density": density,
                                 "messages": messages, "wire": wire_name(wire)})
    return rows


def oktopk_nodes_price(size: int, k: int, n: int, per_node: int, profile: Profile, wire: Wire,
                       flat: tuple[float, float, float]) -> tuple[float, float, float]:
    """(seconds on the links, bytes per rank, messages) of an Ok-Topk step whose allgather
    phase runs in two levels (:mod:`cupycoll.topk._oktopk_nodes`: ranks r // per_node share a
    node; coo wire), or ``flat`` when it does not. Split-and-reduce and balance keep the flat
    prices; the allgather's node gather and broadcast go on ``profile.link("intra")``, the
    leaders' exchange on ``link("inter")``, from the exact per-step traffic of a leader
    (rank 0) and a non-leader (rank 1) with T = k balanced blocks."""
    topo = Topology.of([r // per_node for r in range(size)])
    if not two_level(topo, wire):
        return flat
    seconds, nbytes, messages = flat
    ag_words = 2.0 * k * (size - 1) / size
    ag_bytes = topk_bytes("oktopk", ag_words, k, n, wire)
    seconds -= profile.alpha_p2p * (size - 1) + profile.beta_p2p * ag_bytes
    blocks = block_sizes(k, size)
    entry = 4 + (2 if wire.values else 4)
    leader = allgather_nodes_cost(topo, blocks, 0, lambda c: c * entry)
    member = allgather_nodes_cost(topo, blocks, 1, lambda c: c * entry)
    links = {OPS[0]: profile.link("intra"), OPS[1]: profile.link("inter")}
    for op, (b, m) in leader.items():
        link = links[op]
        seconds += link.alpha_p2p + link.alpha_msg * (m - 1) + link.beta_p2p * b
    if OPS[2] in member:  # the leader sends the payload to each other rank of its node
        intra, (b, _) = profile.link("intra"), member[OPS[2]]
        seconds += intra.alpha_p2p + intra.alpha_msg * (len(topo.members[0]) - 2) \
            + intra.beta_p2p * b
    most = max(sum(b for b, _ in leader.values()), sum(b for b, _ in member.values()))
    hops = sum(m for _, m in leader.values()) + 1
    return seconds, nbytes - ag_bytes + most, messages - (size - 1) + hops


def _variant(row: dict[str, Any]) -> str:
    """The wire format of a row, and ``/dense`` for a dense output."""
    return row.get("wire", "coo") + ("/dense" if row.get("output") == "dense" else "")


def crossover_table(rows: list[dict[str, Any]]) -> list[str]:
    """Lines: for each family, network and wire format (and output), the fastest algorithm at
    every P."""
    lines = []
    keys = sorted({(r["family"], r["network"], _variant(r)) for r in rows})
    sizes = sorted({r["P"] for r in rows})
    lines.append("| family | network | wire | " + " | ".join(f"P={p}" for p in sizes) + " |")
    lines.append("|---|---|---|" + "---|" * len(sizes))
    for family, net, wire in keys:
        cells = []
        for p in sizes:
            group = [r for r in rows if (r["family"], r["network"], r["P"],
                                         _variant(r)) == (family, net, p, wire)]
            best = min(group, key=lambda r: r["predicted_s"]) if group else None
            cells.append(f"{best['algorithm']} {best['predicted_s'] * 1e3:.3g} ms" if best
                         else "-")
        lines.append(f"| {family} | {net} | {wire} | " + " | ".join(cells) + " |")
    return lines


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Time vs P per algorithm, one panel per (family, network)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["family"], r["network"]) for r in rows})
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), squeeze=False)
    for ax, (family, net) in zip(axes[0], keys):
        group = [r for r in rows if (r["family"], r["network"]) == (family, net)]
        for name in sorted({r["algorithm"] for r in group}):
            pts = sorted((r["P"], r["predicted_s"]) for r in group if r["algorithm"] == name)
            ax.loglog([p for p, _ in pts], [t for _, t in pts], marker="o", ms=3, label=name)
        ax.set_title(f"{family} / {net}", fontsize=9)
        ax.set_xlabel("P")
        ax.set_ylabel("predicted s")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(made_folder(path), dpi=110)


def _bounded(low: float, high: float, *, low_open: bool = False) -> Any:
    """argparse's type for a finite number in [low, high] (``low_open``: (low, high])."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (low < value <= high if low_open else low <= value <= high):
            raise argparse.ArgumentTypeError(
                f"must be a number in {'(' if low_open else '['}{low:g}, {high:g}], got {text!r}")
        return value

    return parse


def _wire(text: str) -> Wire:
    """``coo``, ``compact``, optionally ``+bfloat16`` / ``+float16``."""
    name, _, values = text.partition("+")
    if name not in ("coo", "compact") or values not in ("", "bfloat16", "float16"):
        raise argparse.ArgumentTypeError(f"unknown wire format {text!r}: coo or compact, "
                                         "optionally +bfloat16 or +float16")
    return Wire(name == "compact", values or None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # (lists may be empty: nothing to simulate, which run() says)
    parser.add_argument("--P", type=listed(checked(int, lambda v: 1 <= v <= 1 << 20,
                                                   "an int from 1 to 1048576"), 0),
                        default="2,4,8,16,32,64,128,256,512,1024",
                        help="rank counts (comma list)")
    parser.add_argument("--networks", type=listed(one_of(*NETWORKS, "machine"), 0),
                        default="nvlink,ib400,eth100",
                        help=f"comma list of {sorted(NETWORKS)} or machine")
    parser.add_argument("--n", type=parse_length, default=2 ** 24,
                        help="dense length (16M, 64K, 1e6, ...: sizes as the benchmarks')")
    parser.add_argument("--density", type=_bounded(0, 1, low_open=True), default=0.01,
                        help="nnz / n per rank (or k/n), in (0, 1]")
    parser.add_argument("--width", type=checked(int, lambda v: 0 <= v < 2**62,
                                                "an int >= 0 and below 2**62"),
                        default=0,
                        help="row width of the sparse family (0: one value an index)")
    parser.add_argument("--skew", type=_bounded(0, 2**31), default=0.0,
                        help="rank 0 has (1+skew) x nnz")
    parser.add_argument("--family", type=listed(one_of("sparse", "topk", "both"), 0),
                        default="sparse,topk", help="sparse, topk or both")
    parser.add_argument("--wire", type=listed(_wire, 0), default="coo", help="wire formats: comma "
                        "list of coo, compact, coo+bfloat16, compact+bfloat16, ... (rows per "
                        "format)")
    parser.add_argument("--output", type=listed(one_of("sparse", "dense", "both"), 0),
                        default="sparse", help="the sparse family's result: sparse, dense (the "
                        "n-vector, output='dense') or both, comma separated")
    parser.add_argument("--json", type=output_file, help="write {'rows': [...]} to this file")
    parser.add_argument("--plot", type=plot_file,
                        help="draw time vs P per algorithm to this PNG")


def run(args: argparse.Namespace) -> int:
    """Print the crossover table of the parsed arguments (:func:`add_arguments`), write the
    rows to --json and draw them to --plot; 2 when there is nothing to simulate."""
    sizes, networks, n = args.P, args.networks, args.n
    families = {"sparse", "topk"} if "both" in args.family else set(args.family)
    outputs = ("sparse", "dense") if "both" in args.output else tuple(dict.fromkeys(args.output))
    wires, rows = tuple(args.wire), []
    if "sparse" in families:
        rows += sparse_rows(sizes, networks, n, args.density, args.width, args.skew, wires,
                            outputs)
    if "topk" in families:
        rows += topk_rows(sizes, networks, n, args.density, wires)
    if not rows:  # a usage error: nothing to price
        print("cupycoll simulate: error: nothing to simulate (--networks, --wire and --output "
              f"name one at least, and a network holds --P {','.join(map(str, sizes))} ranks)",
              file=sys.stderr)
        return 2
    for line in crossover_table(rows):
        print(line)
    if args.json:
        with open(made_folder(args.json), "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    if args.plot:
        plot(rows, args.plot)
    return 0
