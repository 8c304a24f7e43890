"""GPT-3's sparse layers attend in blocks: each block of W queries sees its own block and the
previous one, so scores and mask grow as T x 2W; the result equals the dense band-masked one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from glm_dist.models import common
from glm_dist.models.common import CausalSelfAttention
from glm_dist.families.gpt.model import GPT, gpt_config
from tests.conftest import ROOT, clean_env


def _dense_reference(attn: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer as it was: SDPA over all T x T scores with the (T, T) band mask."""
    B, T, C = x.shape
    q, k, v = (t.view(B, T, attn.n_head, -1).transpose(1, 2) for t in attn.qkv(x).chunk(3, dim=2))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn._band(T, x.device))
    return attn.proj(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("T,W", [(10, 4), (12, 4), (13, 3), (9, 8), (7, 1), (300, 64)])
def test_blocked_band_equals_the_dense_band_mask(T, W):
    torch.manual_seed(0)
    attn = CausalSelfAttention(32, 4, window=W)
    x = torch.randn(2, T, 32, requires_grad=True)
    ours, ref = attn(x), _dense_reference(attn, x)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    params = [x, *attn.parameters()]
    for a, b in zip(torch.autograd.grad(ours.square().sum(), params), torch.autograd.grad(ref.square().sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_token_outside_the_window_changes_nothing():
    torch.manual_seed(0)
    attn = CausalSelfAttention(32, 2, window=5).eval()
    x = torch.randn(1, 23, 32)
    x2 = x.clone()
    x2[0, 7] += 10.0  # seen by positions 7..11 only
    y, y2 = attn(x), attn(x2)
    assert torch.equal(y[0, :7], y2[0, :7]) and torch.equal(y[0, 12:], y2[0, 12:])
    assert not torch.allclose(y[0, 7:12], y2[0, 7:12])


def test_scores_and_mask_grow_as_t_times_window(monkeypatch):
    """What SDPA is asked for at seq 2048, window 256: blocks of 256 queries against 512 keys, a mask
    of (8, 256, 512) -- a quarter of the dense layer's 2048 x 2048 scores, shared by every head."""
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append((tuple(q.shape), tuple(k.shape), None if attn_mask is None else tuple(attn_mask.shape)))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(common.F, "scaled_dot_product_attention", spy)
    model = GPT(
        gpt_config("tiny", n_layer=2, d_model=32, n_head=2, vocab_size=50, context_length=2048, sparse_window=256)
    )
    with torch.no_grad():
        model(torch.zeros(1, 2048, dtype=torch.long))
    dense_layer, sparse_layer = calls
    assert dense_layer == ((1, 2, 2048, 16), (1, 2, 2048, 16), None)  # is_causal: flash kernels, no mask
    assert sparse_layer == ((2, 8, 256, 16), (2, 8, 512, 16), (1, 8, 256, 512))
    scores = lambda q, k: q[0] * q[1] * q[2] * k[2]  # noqa: E731
    assert scores(*sparse_layer[:2]) * 4 == 2 * 2048 * 2048


def test_measured_memory_follows_the_scores_with_the_math_kernel():
    """bench/banded_attention.py at seq 2048, window 256 where SDPA keeps its scores (math kernel,
    as when no fused kernel takes the inputs): the blocked layer holds a fraction of the dense one's."""
    proc = subprocess.run(
        [
            sys.executable,
            "bench/banded_attention.py",
            "--backend",
            "math",
            "--batch",
            "1",
            "--heads",
            "4",
            "--repeats",
            "1",
            "--json",
        ],
        cwd=ROOT,
        env=clean_env(2),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    assert r["max_diff"] < 1e-5
    assert r["score_elements"] == {"dense": 2048 * 2048, "blocked": 2048 * 512}
    assert r["blocked"]["peak_mib"] < r["dense"]["peak_mib"] / 2, r
