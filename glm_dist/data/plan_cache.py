"""Epoch plans of builder-planned objectives (data/plan.py ``BuiltPlan``), cached as data.

Planning runs the objective's builder over every document of an epoch in Python; its result -- the
epoch's units as runs, and each builder's state at the end of the epoch -- is saved once, next to
the document table (``DIR/.glm-index/plans/KEY/``, or under ``data.cache_dir``), keyed by
everything the units depend on (the shard set, seed, seq_len, objective and its options, shuffle
window, streams). Each epoch is ``epoch-E.npz`` (loaded with ``allow_pickle=False``) and
``epoch-E.json``, written last: the units' shapes (a unit's tree: NSP/SOP's dicts, T5's and
XLNet's tuples, plain arrays; units of several shapes in one epoch are kept apart by a tree number
per unit), the end states, and the size and SHA-256 of the ``.npz``. A cache whose files do not
match -- torn, truncated, edited, another format -- is never used: the epoch is planned again, the
cache rewritten, and a warning says which file was wrong.

Shared tables a unit refers to (``plan.consts``) are saved with the epoch and matched by value
to the tables the running plan already has, so units read back refer to the same objects.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np

from glm_dist.data.plan import EncodedUnit

log = logging.getLogger(__name__)
PLAN_FORMAT = "glm-dist/epoch-plan/v2"
MAX_META_BYTES = 256 * 2**20


class CorruptPlan(ValueError):
    """A cached plan that does not match its record (the epoch is planned again)."""


def _lists(tree):
    return [_lists(t) for t in tree] if isinstance(tree, (tuple, list)) else tree


def _tuples(tree):
    return tuple(_tuples(t) for t in tree) if isinstance(tree, list) else tree


def _const_refs(tree: tuple, out: set) -> set:
    """The indices of the shared tables a unit tree refers to."""
    if tree[0] == "c":
        out.add(tree[1])
    for child in tree[1] if tree[0] == "t" else tree[2] if tree[0] == "d" else ():
        _const_refs(child, out)
    return out


def _renumber(tree: tuple, mapping: dict[int, int]) -> tuple:
    if tree[0] == "c":
        return ("c", mapping[tree[1]])
    if tree[0] == "t":
        return ("t", tuple(_renumber(t, mapping) for t in tree[1]))
    if tree[0] == "d":
        return ("d", tree[1], tuple(_renumber(t, mapping) for t in tree[2]))
    return tree


class PlanCache:
    def __init__(self, folder: str):
        self.folder = Path(folder)

    def load(self, epoch: int, consts: list) -> tuple[list[list[EncodedUnit]], list[dict]] | None:
        """(units per stream, end states), or None when this epoch is not cached or its files are not
        what their record says (warned). Tables the units share are matched into ``consts``."""
        meta_path = self.folder / f"epoch-{epoch}.json"
        if not meta_path.exists():
            return None
        try:
            with open(meta_path, "rb") as f:
                meta = json.loads(f.read(MAX_META_BYTES + 1))
            if not isinstance(meta, dict) or meta.get("format") != PLAN_FORMAT:
                raise CorruptPlan(
                    f"format {meta.get('format') if isinstance(meta, dict) else None!r}, not {PLAN_FORMAT!r}"
                )
            with np.load(self._verified_npz(epoch, meta), allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            return _units(meta, arrays, consts), meta["ends"]
        except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
            log.warning("ignoring the cached plan of epoch %d in %s (%s): planning it again", epoch, self.folder, err)
            return None

    def _verified_npz(self, epoch: int, meta: dict) -> Path:
        path = self.folder / f"epoch-{epoch}.npz"
        size, digest = int(meta["npz_bytes"]), hashlib.sha256()
        if os.path.getsize(path) != size:
            raise CorruptPlan(f"{path.name} is {os.path.getsize(path)} bytes, its record says {size}")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
        if digest.hexdigest() != meta["npz_sha256"]:
            raise CorruptPlan(f"{path.name} does not match the SHA-256 in {path.stem}.json")
        return path

    def save(self, epoch: int, units: list[list[EncodedUnit]], ends: list[dict], consts: list) -> None:
        flat = [u for stream in units for u in stream]
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            arrays, trees = _arrays(flat, [len(s) for s in units], consts)
            buf = io.BytesIO()
            np.savez(buf, **arrays)
            data = buf.getvalue()
            meta = {
                "format": PLAN_FORMAT,
                "trees": trees,
                "ends": ends,
                "npz_bytes": len(data),
                "npz_sha256": hashlib.sha256(data).hexdigest(),
            }
            _write(self.folder / f"epoch-{epoch}.npz", data)
            _write(self.folder / f"epoch-{epoch}.json", json.dumps(meta).encode())
        except (OSError, TypeError, ValueError) as err:
            log.warning("cannot cache the plan of epoch %d in %s: %s", epoch, self.folder, err)


def _arrays(flat: list[EncodedUnit], counts: list[int], consts: list) -> tuple[dict[str, np.ndarray], list[dict]]:
    """The units as columns, one group per distinct tree: ``tree_of`` numbers each unit's tree, and
    group ``t`` keeps leaf ``j`` of its units as ``t{t}_runs{j}`` + ``t{t}_ptr{j}`` (array leaves:
    concatenated runs and where each unit's start) or ``t{t}_leaf{j}`` (scalars)."""
    numbers: dict[tuple, int] = {}
    tree_of = np.asarray([numbers.setdefault(u.tree, len(numbers)) for u in flat], dtype=np.int64)
    arrays = {"stream_ptr": np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), "tree_of": tree_of}
    trees = []
    for tree, t in numbers.items():
        group = [u for u, k in zip(flat, tree_of) if k == t]
        kinds = []
        for j, leaf in enumerate(group[0].leaves):
            column = [u.leaves[j] for u in group]
            if isinstance(leaf, np.ndarray):
                kinds.append("runs")
                arrays[f"t{t}_runs{j}"] = np.concatenate(column).reshape(-1, 3)
                arrays[f"t{t}_ptr{j}"] = np.concatenate([[0], np.cumsum([len(c) for c in column])]).astype(np.int64)
            else:
                kinds.append("bool" if isinstance(leaf, (bool, np.bool_)) else "int")
                arrays[f"t{t}_leaf{j}"] = np.asarray(column, dtype=np.int64)
        refs = sorted(_const_refs(tree, set()))
        for i in refs:
            arrays[f"t{t}_const{i}"] = consts[i]
        trees.append({"tree": _lists(tree), "kinds": kinds, "consts": refs})
    return arrays, trees


def _shared(table: np.ndarray, consts: list) -> int:
    """The index in ``consts`` of a table equal to ``table`` (appended if there is none)."""
    for i, c in enumerate(consts):
        if c.dtype == table.dtype and c.shape == table.shape and np.array_equal(c, table):
            return i
    consts.append(table)
    return len(consts) - 1


def _units(meta: dict, arrays: dict[str, np.ndarray], consts: list) -> list[list[EncodedUnit]]:
    ptr, tree_of = arrays["stream_ptr"], arrays["tree_of"]
    total = int(ptr[-1])
    if len(tree_of) != total or (total and not 0 <= tree_of.min() <= tree_of.max() < len(meta["trees"])):
        raise CorruptPlan(f"{len(tree_of)} tree numbers for {total} units")
    groups = []
    for t, entry in enumerate(meta["trees"]):
        mapping = {i: _shared(arrays[f"t{t}_const{i}"], consts) for i in entry["consts"]}
        tree, size, columns = _renumber(_tuples(entry["tree"]), mapping), int((tree_of == t).sum()), []
        for j, kind in enumerate(entry["kinds"]):
            if kind == "runs":
                runs, at = arrays[f"t{t}_runs{j}"], arrays[f"t{t}_ptr{j}"]
                if len(at) != size + 1 or at[-1] != len(runs):
                    raise CorruptPlan(f"tree {t} leaf {j}: {len(at) - 1} run lists for {size} units")
                columns.append([runs[at[u] : at[u + 1]] for u in range(size)])
            else:
                values = arrays[f"t{t}_leaf{j}"]
                if len(values) != size:
                    raise CorruptPlan(f"tree {t} leaf {j}: {len(values)} values for {size} units")
                columns.append([bool(v) if kind == "bool" else int(v) for v in values])
        groups.append([EncodedUnit(tree, tuple(c[u] for c in columns)) for u in range(size)])
    taken = [0] * len(groups)
    flat = []
    for t in tree_of.tolist():
        flat.append(groups[t][taken[t]])
        taken[t] += 1
    return [flat[ptr[b] : ptr[b + 1]] for b in range(len(ptr) - 1)]


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
