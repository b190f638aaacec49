"""NVLink cliques: which GPUs of a node share an NVLink, and the sets of GPUs every pair
of which does (SPEC §5: a chain of bridges 0–1–2–3 is not one clique; on an NVSwitch
system every GPU on the switch fabric is linked to every other).

The link matrix comes from the inventory: each GPU lists the PCI addresses at the far
end of its active links (`GpuInfo.nvlink_peers`), another GPU of the node (a bridge) or
an NVSwitch. Two GPUs are linked when one names the other or both reach one switch.

It lives in `shared/` because both sides use it: the agent labels each GPU with a clique
(`clique_partition`), the coordinator's placer finds cliques among free GPUs.

Maximal cliques are found by Bron–Kerbosch with pivoting over bitmasks: a node has at
most a few dozen GPUs, and on the usual shapes (all linked, pairs, none) it is a handful
of steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shared.ids import normalize_pci


def peer_sets(gpus: Iterable[tuple[str, str, Iterable[str]]]) -> dict[str, frozenset[str]]:
    """GPU UUID → UUIDs of the node's GPUs it shares an NVLink with, from
    (uuid, pciBusId, nvlinkPeers) of every GPU of one node."""
    rows = [
        (uuid, normalize_pci(pci), {normalize_pci(r) for r in remotes})
        for uuid, pci, remotes in gpus
    ]
    by_pci = {pci: uuid for uuid, pci, _ in rows if pci}
    peers: dict[str, set[str]] = {uuid: set() for uuid, _, _ in rows}
    on_switch: dict[str, set[str]] = {}
    for uuid, _, remotes in rows:
        for remote in remotes:
            other = by_pci.get(remote)
            if other is None:
                on_switch.setdefault(remote, set()).add(uuid)
            elif other != uuid:
                peers[uuid].add(other)
                peers[other].add(uuid)
    for members in on_switch.values():
        for uuid in members:
            peers[uuid] |= members - {uuid}
    return {uuid: frozenset(p) for uuid, p in peers.items()}


def maximal_cliques(adjacency: Sequence[int]) -> list[int]:
    """Every maximal clique of a graph given as neighbour bitmasks (bit j of
    adjacency[i]: i and j are linked), each as a bitmask of its vertices."""
    out: list[int] = []

    def expand(r: int, p: int, x: int) -> None:
        if not p and not x:
            out.append(r)
            return
        pivot_pool = p | x
        pivot, best = 0, -1
        while pivot_pool:
            low = pivot_pool & -pivot_pool
            u = low.bit_length() - 1
            reach = (adjacency[u] & p).bit_count()
            if reach > best:
                pivot, best = u, reach
            pivot_pool ^= low
        candidates = p & ~adjacency[pivot]
        while candidates:
            low = candidates & -candidates
            v = low.bit_length() - 1
            expand(r | low, p & adjacency[v], x & adjacency[v])
            p &= ~low
            x |= low
            candidates ^= low

    if adjacency:
        expand(0, (1 << len(adjacency)) - 1, 0)
    return out


def bits(mask: int) -> list[int]:
    """Indices of the set bits, lowest first."""
    found: list[int] = []
    while mask:
        low = mask & -mask
        found.append(low.bit_length() - 1)
        mask ^= low
    return found


def clique_partition(adjacency: Sequence[int]) -> list[int]:
    """Disjoint cliques covering every vertex, each as a bitmask: repeatedly the largest
    maximal clique of what is left (ties: the one with the lowest vertices), so the first
    is a largest clique of the graph and every part is a clique, never a chain."""
    left = (1 << len(adjacency)) - 1
    parts: list[int] = []
    while left:
        sub = [adjacency[v] & left if left >> v & 1 else 0 for v in range(len(adjacency))]
        found = [m & left for m in maximal_cliques(sub) if m & left]
        best = min(found, key=lambda m: (-m.bit_count(), bits(m)))
        parts.append(best)
        left &= ~best
    return parts
