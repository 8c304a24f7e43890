"""GPT model: published sizes, structure, sparse attention, no distribution imports."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from glm_dist.models.common import count_parameters
from glm_dist.families.gpt.model import GPT, gpt_config
from glm_dist.families.registry import build_model, published_flavors

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", list(published_flavors("gpt")))
def test_published_size_reproduces_published_parameter_count(name):
    flavor = published_flavors("gpt")[name]
    with torch.device("meta"):
        model = build_model("gpt", flavor.cfg)
    n = count_parameters(model)
    assert abs(n - flavor.params) / flavor.params <= flavor.tol, f"{name}: {n:,} vs {flavor.params:,.0f}"


@pytest.mark.parametrize("name", ["gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"])
def test_gpt2_counts_equal_transformers_exactly(name):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = published_flavors("gpt")[name].cfg
    with torch.device("meta"):
        ours = count_parameters(build_model("gpt", cfg))
        theirs = GPT2LMHeadModel(
            GPT2Config(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.d_model)
        ).num_parameters()
    assert ours == theirs


def test_models_import_nothing_distributed():
    """Decision 2: the model definitions (models/ and each family's model.py) know no parallel runtime."""
    paths = [*(ROOT / "glm_dist/models").rglob("*.py"), *(ROOT / "glm_dist/families").glob("*/model.py")]
    assert len(paths) > 14
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert not name.startswith(("deepspeed", "torch.distributed")), f"{path} imports {name}"


def test_layer_list_composes_to_the_model():
    torch.manual_seed(0)
    model = GPT(gpt_config("tiny", n_layer=3, d_model=64, vocab_size=300)).eval()
    x = torch.randint(0, 300, (2, 17))
    h = x
    for layer in model.layers():
        h = layer(h)
    assert len(model.layers()) == 3 + 2
    torch.testing.assert_close(h, model(x))
    assert model.head.lm_head.weight is model.embed.wte.weight  # tied


def test_residual_projections_are_scaled_by_depth():
    torch.manual_seed(0)
    n_layer = 8
    model = GPT(gpt_config("tiny", n_layer=n_layer, d_model=256, vocab_size=1000))
    proj_std = model.blocks[0].mlp.proj.weight.std().item()
    fc_std = model.blocks[0].mlp.fc.weight.std().item()
    assert fc_std == pytest.approx(0.02, rel=0.05)
    assert proj_std == pytest.approx(0.02 / math.sqrt(2 * n_layer), rel=0.05)


def test_sparse_layers_attend_to_a_local_band_only():
    torch.manual_seed(0)
    cfg = gpt_config("tiny", n_layer=2, d_model=32, n_head=2, vocab_size=100, sparse_window=4)
    model = GPT(cfg).eval()
    assert model.blocks[0].attn.window is None and model.blocks[1].attn.window == 4
    attn = model.blocks[1].attn
    x = torch.randn(1, 10, 32)
    q, k, v = attn.qkv(x).split(32, dim=2)
    q, k, v = (t.view(1, 10, 2, 16).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(16)
    i = torch.arange(10)
    allowed = (i[:, None] - i[None, :] >= 0) & (i[:, None] - i[None, :] < 4)
    ref = F.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v
    ref = attn.proj(ref.transpose(1, 2).reshape(1, 10, 32))
    torch.testing.assert_close(attn(x), ref, atol=1e-5, rtol=1e-5)
    # A token beyond the band does not influence the output of a sparse layer.
    y1 = attn(x)
    x2 = x.clone()
    x2[0, 0] += 10.0
    assert torch.allclose(attn(x2)[0, 6:], y1[0, 6:], atol=1e-6)


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = GPT(gpt_config("tiny", n_layer=2, d_model=64, vocab_size=200))
    x = torch.randint(0, 200, (2, 16))
    model(x).float().sum().backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.activation_checkpointing = True
    model(x).float().sum().backward()
    for p, g in zip(model.parameters(), ref):
        torch.testing.assert_close(p.grad, g)


def test_sequence_longer_than_context_is_rejected():
    model = GPT(gpt_config("tiny", n_layer=1, d_model=32, vocab_size=50, context_length=8))
    with pytest.raises(ValueError, match="sequence length 9 exceeds the context length 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


ENCODER_FAMILIES = ("bert", "roberta", "albert", "electra")


@pytest.mark.parametrize("name", [n for fam in ENCODER_FAMILIES for n in published_flavors(fam)])
def test_encoder_published_size_reproduces_published_parameter_count(name):
    from glm_dist.families.bert.model import Encoder

    flavor = published_flavors(name.split("-")[0])[name]
    with torch.device("meta"):
        n = count_parameters(Encoder(flavor.cfg))  # ELECTRA: the discriminator, as published
    assert abs(n - flavor.params) / flavor.params <= flavor.tol, f"{name}: {n:,} vs {flavor.params:,.0f}"


@pytest.mark.parametrize(
    "name",
    [
        "bert-base",
        "bert-large",
        "roberta-base",
        "roberta-large",
        "albert-base",
        "albert-xxlarge",
        "electra-small",
        "electra-large",
    ],
)
def test_encoder_counts_equal_transformers_exactly(name):
    from glm_dist.families.bert.hf import hf_model_class, to_hf_config

    from glm_dist.families.bert.model import Encoder

    cfg = published_flavors(name.split("-")[0])[name].cfg
    with torch.device("meta"):
        ours = count_parameters(Encoder(cfg))
        theirs = hf_model_class(cfg)(to_hf_config(cfg)).num_parameters()
    assert ours == theirs


def test_lamb_step_is_adam_direction_scaled_by_the_trust_ratio():
    from glm_dist.train.optim import Lamb

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 4))
    w0, g = w.detach().clone(), torch.randn(8, 4)
    w.grad = g.clone()
    Lamb([w], lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01).step()
    m, v = 0.1 * g / 0.1, 0.001 * g * g / 0.001  # bias-corrected first step
    update = m / (v.sqrt() + 1e-6) + 0.01 * w0
    expected = w0 - 0.1 * (w0.norm() / update.norm()) * update
    torch.testing.assert_close(w.detach(), expected)
    assert (w.detach() - w0).norm().item() == pytest.approx(0.1 * w0.norm().item(), rel=1e-5)  # ||Δw|| = lr ||w||
