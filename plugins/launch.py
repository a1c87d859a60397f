"""Where the processes of a plan run, and the torchrun script that starts them on every node.

Shared by the targets launched with torchrun (Megatron-LM, torchtitan). Host names and every
literal path go through :func:`shlex.quote`: cluster.yaml is user input and a host called
``gpu-01;rm -rf ~`` must stay a string.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from autoplan.cluster.spec import ClusterSpec, load_cluster_spec
from autoplan.errors import ExportError
from autoplan.plan import Result

DEFAULT_MASTER_PORT = 29500
# Rank order every target builds (innermost first): Megatron's tp-cp-ep-dp-pp, torchtitan's
# [pp, dp, cp, tp] mesh, DeepSpeed's pipe-data topology, Colossal-AI with dp_outside=False.
TARGET_PLACEMENT = "tp-cp-dp-pp"


@dataclass(frozen=True, slots=True)
class Nodes:
    """The nodes a plan uses, in node-rank order.

    ``hosts`` holds (name, ip) pairs and is empty when cluster.yaml lists no hosts; ``network``
    is the inter-node link kind (``infiniband``, ``roce``, ``ethernet``), None on one node.
    """

    num_nodes: int
    gpus_per_node: int
    hosts: tuple[tuple[str, str], ...]
    network: str | None
    interface: str | None
    groups: tuple[tuple[str, int, int], ...] = ()
    """On a cluster of node groups: (group, first node rank, nodes) in node-rank order."""

    @property
    def master_ip(self) -> str | None:
        """The address of node rank 0, None when it must come from the user."""
        if self.hosts:
            return self.hosts[0][1]
        return "127.0.0.1" if self.num_nodes == 1 else None


def nodes_of(result: Result) -> Nodes:
    """The nodes the plan's ``world_size`` GPUs occupy, filled node by node in host order.

    Raises:
        ExportError: no cluster in the plan JSON, or a world size that leaves a node part-used.
    """
    if result.cluster is None:
        raise ExportError(
            "the plan JSON has no 'cluster' section, so no launch script can be written; re-run "
            "'autoplan solve --json' with the current autoplan."
        )
    # The validated spec says all a launcher needs; the hardware catalog is not consulted.
    spec = load_cluster_spec(result.cluster)
    if spec.groups is not None:
        return _group_nodes(result, spec)
    world = result.plan.world_size
    per_node = min(spec.gpus_per_node, world)
    if world % per_node or world > spec.nodes * spec.gpus_per_node:
        raise ExportError(
            f"the plan uses {world} GPUs, which does not fill whole nodes of "
            f"{spec.gpus_per_node} GPUs on a {spec.nodes}-node cluster; plan for a "
            f"multiple of {spec.gpus_per_node} GPUs."
        )
    num_nodes = world // per_node
    inter = spec.inter_node
    return Nodes(
        num_nodes=num_nodes, gpus_per_node=per_node,
        hosts=tuple((host.name, host.ip) for host in spec.hosts or ())[:num_nodes],
        network=inter.link if inter is not None and num_nodes > 1 else None,
        interface=inter.interface if inter is not None else None,
    )


def stage_runs(result: Result, spec: ClusterSpec) -> list[tuple[str, int]]:
    """(group, stages) in pipeline order: the plan's stage groups, or for a plan without them
    (a cluster of identical groups) the groups filled in cluster.yaml order."""
    plan = result.plan
    if plan.stage_groups is not None:
        runs: list[tuple[str, int]] = []
        for name in plan.stage_groups:
            if runs and runs[-1][0] == name:
                runs[-1] = (name, runs[-1][1] + 1)
            else:
                runs.append((name, 1))
        return runs
    per_stage, runs, left = plan.tp * plan.dp * plan.cp, [], plan.pp
    for group in spec.groups:
        take = min(left, group.nodes * group.gpus_per_node // per_stage)
        runs += [(group.name, take)] if take else []
        left -= take
    return runs


def _group_nodes(result: Result, spec: ClusterSpec) -> Nodes:
    """The nodes of a plan on node groups: each group's stages on its own nodes, node ranks
    in pipeline order (the pipeline axis is outermost, so a stage's ranks are consecutive).

    Raises:
        ExportError: the groups used have different GPUs per node (torchrun starts as many
            processes on every node), or a group's stages leave a node part-used.
    """
    plan, groups = result.plan, {g.name: g for g in spec.groups}
    runs = stage_runs(result, spec)
    widths = {groups[name].gpus_per_node for name, _ in runs}
    if len(widths) > 1:
        raise ExportError(
            f"the plan's stages run on groups with {sorted(widths)} GPUs per node, but torchrun "
            "starts the same number of processes on every node; re-plan on groups with equal "
            "gpus_per_node.")
    per_node = min(widths.pop(), plan.world_size)
    per_stage, hosts, placed, first = plan.tp * plan.dp * plan.cp, [], [], 0
    for name, stages in runs:
        gpus, group = stages * per_stage, groups[name]
        if gpus % per_node or gpus > group.nodes * group.gpus_per_node:
            raise ExportError(
                f"the plan puts {stages} stages of {per_stage} GPUs ({gpus} GPUs) on group "
                f"{name!r}, which does not fill whole nodes of its {group.nodes} x "
                f"{group.gpus_per_node} GPUs; re-plan so that each group's stages fill whole nodes.")
        placed.append((name, first, gpus // per_node))
        hosts += [(h.name, h.ip) for h in (group.hosts or ())][:gpus // per_node]
        first += gpus // per_node
    used = [groups[name] for name, _ in runs]
    links = {g.inter_node.link for g in used if g.inter_node is not None}
    interfaces = {g.inter_node.interface if g.inter_node else None for g in used}
    return Nodes(num_nodes=first, gpus_per_node=per_node,
                 hosts=tuple(hosts) if len(hosts) == first else (),
                 network=(links.pop() if len(links) == 1 else "ethernet" if "ethernet" in links
                          else sorted(links)[0]) if links and first > 1 else None,
                 interface=interfaces.pop() if len(interfaces) == 1 else None,
                 groups=tuple(placed))


def require_target_placement(result: Result, target: str,
                             orders: tuple[str, ...] = (TARGET_PLACEMENT,), *,
                             places_groups: bool = False) -> None:
    """Check the plan places ranks in an order ``target`` can build (``orders``, innermost
    axis first): which ranks share a node decides whether TP traffic stays on NVLink. A plan
    whose stages run on the node groups of a heterogeneous cluster needs a target that
    ``places_groups`` (each stage's ranks started on its group's hosts, its own layer count)
    and the pipeline axis outermost (a stage's ranks consecutive).

    Raises:
        ExportError: the plan's placement is not one of ``orders``, or its stages are on node
            groups that ``target`` cannot place.
    """
    if result.plan.stage_groups is not None:
        if not places_groups:
            runs = ", ".join(f"{name}: {count} stage{'s' * (count > 1)}" for name, count
                             in stage_runs(result, load_cluster_spec(result.cluster)))
            raise ExportError(
                f"this plan runs its pipeline stages on the node groups of a heterogeneous "
                f"cluster ({runs}), which {target} cannot place per group; export it with --to "
                "torchrun or --to megatron, which start each stage's ranks on its group's hosts "
                "with its own layer count.")
        orders = (TARGET_PLACEMENT,)
    if result.plan.placement not in orders:
        raise ExportError(
            f"the plan places ranks as {result.plan.placement!r} but {target} orders them "
            f"{' or '.join(repr(o) for o in orders)} (innermost first); re-plan with "
            f"--placement {orders[0]}.")


def rendezvous_lines(nodes: Nodes) -> list[str]:
    """Shell lines that set MASTER_ADDR, MASTER_PORT and NODE_RANK (overridable from the
    environment); node ranks follow the host order of cluster.yaml."""
    lines = [f"NNODES={nodes.num_nodes}", f"NPROC_PER_NODE={nodes.gpus_per_node}"]
    if nodes.master_ip is None:
        lines.append(': "${MASTER_ADDR:?cluster.yaml lists no hosts: set MASTER_ADDR to the IP '
                     'address of node rank 0}"')
    else:
        lines.append(f'MASTER_ADDR="${{MASTER_ADDR:-{nodes.master_ip}}}"')
    lines.append(f'MASTER_PORT="${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}"')
    if nodes.num_nodes == 1:
        return lines + ['NODE_RANK="${NODE_RANK:-0}"']
    if not nodes.hosts:
        return lines + [': "${NODE_RANK:?cluster.yaml lists no hosts: set NODE_RANK to this '
                        f'node\'s rank, 0 to {nodes.num_nodes - 1}}}"']
    cases = [f"    {shlex.quote(name)}|{shlex.quote(ip)}) NODE_RANK={rank} ;;"
             for rank, (name, ip) in enumerate(nodes.hosts)]
    return lines + [
        'if [[ -z "${NODE_RANK:-}" ]]; then',
        '  case "$(hostname -s)" in',
        *cases,
        '    *) echo "$(hostname -s) is not a host of the plan; set NODE_RANK" >&2; exit 1 ;;',
        "  esac",
        "fi",
    ]


def read_args_lines(args_file: str) -> list[str]:
    """Shell lines that read an arguments file (``--flag value`` lines, ``#`` comments) into the
    array ARGS, so that the file stays the one place the arguments live."""
    return [
        "ARGS=()",
        "while read -r -a words; do",
        '  [[ ${#words[@]} -eq 0 || ${words[0]} == \\#* ]] && continue',
        '  ARGS+=("${words[@]}")',
        f'done < "$HERE"/{shlex.quote(args_file)}',
    ]


def nccl_environment(nodes: Nodes) -> dict[str, str]:
    """NCCL settings for the inter-node network: over plain Ethernet NCCL must not probe for
    InfiniBand, and should use the interface cluster.yaml names. RoCE keeps NCCL's IB transport
    (it is RDMA over Ethernet). NCCL_SOCKET_IFNAME also takes prefixes and ``^`` exclusions.

    Raises:
        ExportError: the interface is not a plain name (it would break the KEY=VALUE file).
    """
    if nodes.interface and not re.fullmatch(r"[\w.:+^-]+", nodes.interface):
        raise ExportError(f"inter_node.interface {nodes.interface!r} is not an interface name "
                          "(letters, digits, '.', '-', '_'); write e.g. interface: eth0.")
    env = {}
    if nodes.network == "ethernet":
        env["NCCL_IB_DISABLE"] = "1"
    if nodes.network is not None and nodes.interface:
        env["NCCL_SOCKET_IFNAME"] = nodes.interface
    return env


def torchrun_script(result: Result, *, header: str, required: dict[str, str],
                    env: dict[str, str], args_file: str, program: str,
                    user_args_first: bool = False) -> str:
    """A bash script that starts the plan's processes on this node with torchrun.

    Args:
        result: the plan.
        header: the comment header (already prefixed with ``#``).
        required: variables the user must set, with the sentence the script prints if unset.
        env: variables exported for the training processes (values are quoted here), after
            the NCCL settings of the inter-node network (nccl_environment).
        args_file: the arguments file beside the script, read into ARGS.
        program: what torchrun runs, as shell words (the caller quotes literals in it).
        user_args_first: put the script's own arguments before the file's, for parsers (tyro)
            that take no top-level flags after a subcommand; the plan's values then win.
    """
    nodes = nodes_of(result)
    lines = ["#!/usr/bin/env bash", header.rstrip("\n"), "set -euo pipefail",
             'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"']
    lines += [f"# node ranks {first}-{first + count - 1}: node group {name}"
              for name, first, count in nodes.groups]
    lines += [f': "${{{name}:?{why}}}"' for name, why in required.items()]
    lines += [f"export {name}={shlex.quote(value)}"
              for name, value in {**nccl_environment(nodes), **env}.items()]
    lines += rendezvous_lines(nodes) + read_args_lines(args_file)
    lines += [
        'exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \\',
        '  --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\',
        f'  {program} ' + ('"$@" "${ARGS[@]}"' if user_args_first else '"${ARGS[@]}" "$@"'),
    ]
    return "\n".join(lines) + "\n"


def args_file_text(header: str, args: list[str]) -> str:
    """An arguments file: the header, then one ``--flag [value...]`` (or subcommand) per line."""
    lines: list[str] = []
    for word in args:
        if word.startswith("--") or ":" in word or not lines:  # a flag, or a tyro subcommand
            lines.append(word)
        else:
            lines[-1] += f" {word}"
    return header + "\n".join(lines) + "\n"
