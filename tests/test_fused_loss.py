"""The chunked cross entropy (glm_dist/ops/cross_entropy.py): equal to the plain loss in values and
gradients, in fp32, bf16 and under autocast; the compiled chunk kernel (the GPU's) equal to the eager
chain, compiled here for the CPU; GPT's clm loss never makes the (tokens x vocab) logits; the memory
it saves, measured, and counted by glm plan."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from glm_dist.families.gpt.model import GPT, gpt_config
from glm_dist.objectives.registry import get_objective
from glm_dist.ops import cross_entropy as ce_ops
from glm_dist.ops.cross_entropy import (
    CHUNK_BYTES_PER_LOGIT,
    cross_entropy,
    linear_cross_entropy,
    loss_logits_bytes,
    vocab_padding,
)
from glm_dist.parallel.plan import model_shape, plan
from tests.conftest import ROOT, clean_env


def _inputs(n=75, c=24, v=301, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, c, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(v, c, generator=g) * 0.3).to(dtype).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.1).to(dtype).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    t[::7] = -100  # ignored rows
    return h, w, b, t


def _grads(loss, *xs):
    return torch.autograd.grad(loss, xs)


@pytest.mark.parametrize("chunk", [1, 16, 75, 4096])
def test_linear_cross_entropy_equals_the_plain_loss_in_fp32(chunk):
    h, w, b, t = _inputs()
    plain = F.cross_entropy(F.linear(h, w, b), t, reduction="sum")
    ce = linear_cross_entropy(h, w, t, bias=b, chunk_tokens=chunk)
    assert int(ce.count) == int((t != -100).sum())
    torch.testing.assert_close(ce.nll, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ce.rows, F.cross_entropy(F.linear(h, w, b), t, reduction="none"), rtol=1e-5, atol=1e-5)
    mean_plain = plain / ce.count
    for ours, ref in zip(_grads(ce.nll / ce.count * 3.0, h, w, b), _grads(mean_plain * 3.0, h, w, b)):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


# 16 rows: the 16-bit gradient of each chunk is added to the fp32 one as it is; 32 rows (more than
# the 24 features): it is widened in the chunk's fp32 logits buffer first
@pytest.mark.parametrize("chunk", [16, 32, 75])
def test_linear_cross_entropy_in_bf16_is_within_bf16_tolerance_of_fp32(chunk):
    h, w, b, t = _inputs()
    ref = F.cross_entropy(F.linear(h, w, b), t)
    ref_grads = _grads(ref, h, w, b)
    h16, w16, b16 = (x.detach().bfloat16().requires_grad_() for x in (h, w, b))
    ce = linear_cross_entropy(h16, w16, t, bias=b16, chunk_tokens=chunk)
    assert ce.nll.dtype == torch.float32
    torch.testing.assert_close(ce.nll / ce.count, ref, rtol=2e-2, atol=2e-2)
    for ours, r in zip(_grads(ce.nll / ce.count, h16, w16, b16), ref_grads):
        assert ours.dtype == torch.bfloat16
        torch.testing.assert_close(ours.float(), r, rtol=2e-2, atol=2e-3)


def test_linear_cross_entropy_under_autocast_computes_like_nn_linear():
    h, w, b, t = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy(F.linear(h, w, b).float(), t)
        ce = linear_cross_entropy(h, w, t, bias=b, chunk_tokens=16)
    torch.testing.assert_close(ce.nll / ce.count, ref, rtol=1e-3, atol=1e-3)
    for ours, r in zip(_grads(ce.nll / ce.count, h, w, b), _grads(ref, h, w, b)):
        assert ours.dtype == torch.float32  # back through the casts to the fp32 leaves
        torch.testing.assert_close(ours, r, rtol=2e-2, atol=2e-3)


def test_the_compiled_chunk_kernel_equals_the_eager_chain():
    """What CUDA runs (one inductor kernel per chunk: loss and gradient of its softmax), compiled for the
    CPU: two chunks of 48 rows, ignored rows and 11 padding columns, against the eager chain and the
    plain loss on the real columns, in fp32."""
    torch._dynamo.reset()
    h, w, _, t = _inputs(n=96, v=301)
    t[t >= 290] = 3  # no target among the padding
    runs = []
    for compiled in (False, True):
        with vocab_padding(11):
            ce = linear_cross_entropy(h, w, t, chunk_tokens=48, compiled=compiled)
        runs.append((ce.nll, ce.rows, *_grads(ce.nll / ce.count, h, w)))
    eager, fused = runs
    plain = F.cross_entropy(F.linear(h, w)[:, :290], t, reduction="sum")
    torch.testing.assert_close(fused[0], plain, rtol=1e-6, atol=1e-5)
    for a, b in zip(fused, eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert torch.equal(fused[3][290:], torch.zeros(11, 24))  # the padding rows get no gradient


def test_on_the_cpu_the_eager_chain_runs_unless_asked(monkeypatch):
    monkeypatch.setattr(ce_ops, "_compiled_chunks", lambda *a, **k: pytest.fail("compiled on the CPU"))
    h, w, b, t = _inputs()
    linear_cross_entropy(h, w, t, bias=b)


class MatmulCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket.__name__ in ("mm", "addmm")
        return func(*args, **(kwargs or {}))


def test_without_grad_only_the_logits_matmul_runs():
    h, w, b, t = _inputs()
    with torch.no_grad(), MatmulCount() as mm:
        ce = linear_cross_entropy(h, w, t, bias=b, chunk_tokens=25)
    assert mm.count == 3 and ce.nll.grad_fn is None  # one per chunk of 25 rows
    with MatmulCount() as mm:
        linear_cross_entropy(h, w, t, bias=b, chunk_tokens=25)
    assert mm.count == 9  # and the two gradient matmuls, made in the forward (never recomputed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_cross_entropy_of_given_logits_equals_the_plain_loss(dtype, reduction):
    _, _, _, t = _inputs()
    logits = (torch.randn(75, 301) * 3).to(dtype).requires_grad_()
    kept = logits.detach().clone()
    ours = cross_entropy(logits, t, chunk_tokens=16, reduction=reduction)
    ref = F.cross_entropy(logits.float(), t, reduction=reduction)
    tol = 1e-5 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(ours, ref, rtol=tol, atol=tol)
    weights = torch.rand_like(ref)  # a per-row incoming gradient for 'none'
    for a, r in zip(_grads((ours * weights).sum(), logits), _grads((ref * weights).sum(), logits)):
        torch.testing.assert_close(a.float(), r.float(), rtol=tol, atol=1e-6 if dtype == torch.float32 else 1e-3)
    assert torch.equal(logits.detach(), kept)  # the caller's logits are not worked on in place


def test_gpt_clm_loss_never_makes_the_logits_and_equals_the_plain_loss():
    torch.manual_seed(0)
    vocab = 997
    model = GPT(gpt_config("tiny", n_layer=1, d_model=64, vocab_size=vocab))
    ids = torch.randint(0, vocab, (5, 257))  # 1280 tokens: two chunks (1024 + 256 rows)
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}

    class Shapes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                self.seen.append(out.numel())
            return out

    with Shapes() as shapes:
        loss, _ = get_objective("clm").loss(model, batch, metrics=False)
    assert max(shapes.seen) == 1024 * vocab  # a chunk of rows, never the (1280, vocab) logits
    ours = torch.autograd.grad(loss, list(model.parameters()))
    logits = model(batch["input_ids"])
    plain = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten())
    torch.testing.assert_close(loss, plain, rtol=1e-5, atol=1e-5)
    for a, r in zip(ours, torch.autograd.grad(plain, list(model.parameters()))):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        _, sums = get_objective("clm").loss(model, batch, metrics=True)
    assert sums["targets"] == 1280 and sums["nll"] == pytest.approx(float(plain.detach()) * 1280, rel=1e-5)
    hidden = model(batch["input_ids"], project=lambda h, w, b: h)  # the final hidden states
    assert hidden.shape == (5, 256, 64) and torch.allclose(model.head.lm_head(hidden), logits, atol=1e-6)


def test_plan_counts_the_loss_by_its_chunk_size():
    from glm_dist.families.registry import family, resolve_model_config

    shape = model_shape(family("gpt"), resolve_model_config("gpt", "gpt2-small"))
    assert shape.fused_loss
    kw = dict(gpus=8, seq_len=2048, micro_batch=8, global_batch=64)
    small, big = (plan(shape, loss_chunk=c, **kw) for c in (512, 2048))
    one_stage = [(a, b) for a, b in zip(small, big) if a.pp == 1]
    pipelined = [(a, b) for a, b in zip(small, big) if a.pp > 1]
    assert one_stage and pipelined
    for a, b in one_stage + pipelined:  # only the chunk moves: this tensor rank's vocabulary columns of it
        assert b.activations - a.activations == pytest.approx(CHUNK_BYTES_PER_LOGIT * 1536 * -(-50257 // a.tp))
    a = next(a for a, _ in one_stage if a.tp == 1)
    fused = loss_logits_bytes(2048 * 8, 50257, d_model=768, fused=True, chunk_tokens=512)
    whole = loss_logits_bytes(2048 * 8, 50257, d_model=768, fused=False, chunk_tokens=512)
    assert whole - fused > 2.5e9  # a pipeline's last stage still holds the 16-bit logits and their gradient
    assert a.activations == pytest.approx(768 * 2048 * 8 * 12 * (10 + 24) + fused)


def test_memory_saved_at_vocab_50257_is_measured_and_planned():
    """The bench beside the plain loss in one process (fp32, 2048 tokens of a 50257 vocabulary):
    the plain loss holds several (tokens x vocab) fp32 tensors, the fused one a chunk of them, as
    the eager chain and as the compiled kernel."""
    proc = subprocess.run(
        [
            sys.executable,
            "bench/loss_memory.py",
            "--tokens",
            "2048",
            "--d-model",
            "64",
            "--chunk",
            "256",
            "--compiled",
            "--compiled-chunk",
            "256",
            "--dtype",
            "fp32",
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
    logits_mib = 2048 * 50257 * 4 / 2**20  # 393 MiB
    assert r["plain"]["peak_mib"] > 2.5 * logits_mib
    assert r["fused"]["peak_mib"] < r["plain"]["peak_mib"] / 5
    assert r["fused"]["peak_mib"] < r["planned_fused_mib"] + 64  # glm plan's count holds, up to the allocator
    assert r["fused"]["loss"] == pytest.approx(r["plain"]["loss"], rel=1e-6) and r["max_grad_diff"] < 1e-6
    assert r["compiled"]["peak_mib"] < r["plain"]["peak_mib"] / 5
    assert r["compiled"]["loss"] == pytest.approx(r["plain"]["loss"], rel=1e-6) and r["compiled_max_grad_diff"] < 1e-6
    assert (r["fused"]["bytes_per_logit"], r["compiled"]["bytes_per_logit"]) == (40, 16)  # fp32: no casts
