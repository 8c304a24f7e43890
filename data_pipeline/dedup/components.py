"""Connected components of the candidate pairs, one partition at a time: large-star / small-star.

Kiveris et al., "Connected Components in MapReduce and Beyond" (SoCC 2014). Each step groups the
edges by one endpoint -- the edges of a node all sit in that node's partition -- and rewires them
towards the smallest id it sees; connectivity and each component's smallest id are preserved:

  large-star at u: every neighbour v > u is linked to m = min(u, neighbours of u)
  small-star at u: u and every neighbour v < u are linked to m = min(those neighbours)

Alternating them turns every component into a star around its smallest member. That state is
checked locally in a large-star step: no node has a smaller neighbour and another neighbour
(``unconverged``); then every edge is (member, smallest id of its component), exactly the labels of
``components`` (one process, scipy) and the same documents are kept. A task holds the edges of
its partition only; the number of steps grows with log(component diameter), not with the corpus.
"""

from __future__ import annotations

import numpy as np


def unique_pairs(edges: np.ndarray) -> np.ndarray:
    """(n, 2) int64 rows, sorted by (first, second) without repeats."""
    if len(edges) == 0:
        return np.zeros((0, 2), np.int64)
    order = np.lexsort((edges[:, 1], edges[:, 0]))
    e = edges[order]
    keep = np.ones(len(e), bool)
    keep[1:] = (e[1:, 0] != e[:-1, 0]) | (e[1:, 1] != e[:-1, 1])
    return e[keep]


def _groups(e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For rows sorted by their first column: group start flags, group index of each row, group sizes."""
    start = np.ones(len(e), bool)
    start[1:] = e[1:, 0] != e[:-1, 0]
    gid = np.cumsum(start) - 1
    sizes = np.diff(np.append(np.flatnonzero(start), len(e)))
    return start, gid, sizes


def large_star(edges: np.ndarray) -> tuple[np.ndarray, dict]:
    """``edges``: (u, v) rows keyed by u, both directions of every edge present for this partition's
    nodes. Returns pairs (v, m) with v > m, and counts: unconverged nodes (a smaller neighbour and
    degree > 1: not a star yet) and centres (only larger neighbours: the smallest of a component)."""
    e = unique_pairs(edges)
    if len(e) == 0:
        return np.zeros((0, 2), np.int64), {"unconverged": 0, "centers": 0}
    start, gid, sizes = _groups(e)
    node, lowest = e[start, 0], e[start, 1]  # sorted: a group's first neighbour is its smallest
    m = np.minimum(node, lowest)[gid]
    up = e[:, 1] > e[:, 0]
    out = np.stack([e[up, 1], m[up]], axis=1)
    counts = {"unconverged": int(((lowest < node) & (sizes > 1)).sum()), "centers": int((lowest > node).sum())}
    return out, counts


def small_star(edges: np.ndarray) -> np.ndarray:
    """``edges``: (u, v) rows with v < u keyed by u. Returns pairs (x, m) with x > m: u and each of its
    smaller neighbours linked to the smallest of them."""
    e = unique_pairs(edges)
    if len(e) == 0:
        return np.zeros((0, 2), np.int64)
    start, gid, _ = _groups(e)
    m = e[start, 1][gid]
    others = e[:, 1] != m
    return np.concatenate([np.stack([e[others, 1], m[others]], axis=1), np.stack([e[start, 0], e[start, 1]], axis=1)])


def components(n: int, edges: np.ndarray) -> np.ndarray:
    """Component label (the smallest member id) of each of ``n`` nodes, in one process (scipy): the
    reference the partitioned steps are tested against."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if len(edges) == 0:
        return np.arange(n)
    graph = coo_matrix((np.ones(len(edges), dtype=np.int8), (edges[:, 0], edges[:, 1])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    smallest = np.full(labels.max() + 1, n, dtype=np.int64)
    np.minimum.at(smallest, labels, np.arange(n))
    return smallest[labels]
