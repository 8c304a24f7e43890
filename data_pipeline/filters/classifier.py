"""GPT-3's document quality classifier (Brown et al. 2020, appendix A).

Logistic regression on hashed word features: positives are curated text (GPT-3 used WebText,
Wikipedia and books), negatives raw crawl. A crawl document is kept iff
``np.random.pareto(alpha) > 1 - score`` (alpha = 9): mostly high-scoring documents, plus some
low-scoring ones for diversity. The random draw is seeded by the document id, so a rerun keeps the
same documents. Features: lowercase words without punctuation (the decontamination normalisation),
hashed into 2^18 buckets, counts scaled to unit length; trained with L-BFGS (scipy) and an L2
penalty. ``glm data train-classifier`` writes the model; the recipe's ``classifier`` stage uses it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import xxhash

from data_pipeline.dedup.hashing import normalize, window_hashes
from data_pipeline.document import Document

N_FEATURES = 2**18


def features(texts: list[str]):
    from scipy.sparse import csr_matrix

    rows, cols, vals = [], [], []
    for i, text in enumerate(texts):
        buckets = (window_hashes(normalize(text, "janitor"), 1, short=False) % np.uint64(N_FEATURES)).astype(np.int64)
        idx, counts = np.unique(buckets, return_counts=True)
        if len(idx) == 0:
            continue
        v = counts.astype(np.float64)
        rows.append(np.full(len(idx), i))
        cols.append(idx)
        vals.append(v / np.linalg.norm(v))
    if not rows:
        return csr_matrix((len(texts), N_FEATURES))
    return csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(len(texts), N_FEATURES)
    )


@dataclass
class QualityClassifier:
    w: np.ndarray
    b: float
    info: dict

    def scores(self, texts: list[str]) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(features(texts) @ self.w + self.b)))

    def decide(self, doc: Document, alpha: float, seed: int) -> str | None:
        score = float(self.scores([doc.text])[0])
        doc.meta["quality_score"] = round(score, 4)
        return None if keep(doc.id, score, alpha, seed) else "classifier: not sampled (pareto)"

    def save(self, path: str) -> None:
        with open(path, "wb") as f:
            np.savez(f, w=self.w.astype(np.float32), b=np.float64(self.b), info=json.dumps(self.info))

    @classmethod
    def load(cls, path: str) -> "QualityClassifier":
        import io

        from data_pipeline.remote import read_limited

        z = np.load(io.BytesIO(read_limited(path, 1 << 30)), allow_pickle=False)  # data, never code
        return cls(z["w"].astype(np.float64), float(z["b"]), json.loads(str(z["info"])))


def keep(doc_id: str, score: float, alpha: float, seed: int) -> bool:
    rng = np.random.default_rng(xxhash.xxh64_intdigest(f"{seed}:{doc_id}".encode()))
    return bool(rng.pareto(alpha) > 1.0 - score)


def train(
    positive: list[str], negative: list[str], *, l2: float = 0.1, holdout: float = 0.2, seed: int = 0
) -> QualityClassifier:
    """Fit on ``positive`` (label 1) and ``negative`` (label 0) texts; report held-out accuracy."""
    from scipy.optimize import minimize

    texts = positive + negative
    y = np.concatenate([np.ones(len(positive)), np.zeros(len(negative))])
    rng = np.random.default_rng(seed)
    test = rng.random(len(texts)) < holdout
    X = features(texts)
    Xtr, ytr = X[~test], y[~test]
    weight = np.where(ytr == 1, 0.5 / max(1, ytr.sum()), 0.5 / max(1, (1 - ytr).sum()))  # balance the classes

    def loss(params: np.ndarray):
        w, b = params[:-1], params[-1]
        z = Xtr @ w + b
        p = 1.0 / (1.0 + np.exp(-z))
        ll = -(weight * (ytr * np.logaddexp(0, -z) + (1 - ytr) * np.logaddexp(0, z))).sum()
        g = weight * (p - ytr)
        return -ll + 0.5 * l2 * (w @ w) / len(ytr), np.concatenate([Xtr.T @ g + l2 * w / len(ytr), [g.sum()]])

    res = minimize(loss, np.zeros(N_FEATURES + 1), jac=True, method="L-BFGS-B", options={"maxiter": 300})
    w, b = res.x[:-1], float(res.x[-1])
    clf = QualityClassifier(w, b, {})
    acc = (
        float(((clf.scores([t for t, m in zip(texts, test) if m]) > 0.5) == y[test].astype(bool)).mean())
        if test.any()
        else None
    )
    clf.info = {
        "positive": len(positive),
        "negative": len(negative),
        "heldout": int(test.sum()),
        "heldout_accuracy": acc,
        "l2": l2,
        "features": N_FEATURES,
    }
    return clf
