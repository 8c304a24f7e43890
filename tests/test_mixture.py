"""Data mixtures (issue 32): the blended order keeps every loader guarantee, the weights follow
GPT-3's and T5's rules, a malformed mixture is one line, and a run accounts for each source (its
train loss, its validation metrics, its tokens and epochs in the data card).

The sources are real text: the session's 500 pydoc documents (conftest ``corpus``) cut into three
JSONL files of different sizes, tokenized as data.mixture's ``source`` entries -- the first trains
the tokenizer, the other two are tokenized with its tokenizer.json (data/mixture.py build_missing).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from data_pipeline.tokenize.prepare import prepare_shards
from glm_common.config_yaml import ConfigError
from glm_dist.config.loader import load_config
from glm_dist.config.schema import DataConfig
from glm_dist.data import mix_report
from glm_dist.data.loader import Loader, validation_batches
from glm_dist.data.mixture import BlendedIndex, Mixture, build_missing, resolve_mixture, scaled_weights
from glm_dist.eval.run import evaluate_checkpoint, load_checkpoint_model
from glm_dist.data.shards import ShardSetError
from glm_dist.errors import GlmError
from glm_dist.ops.cross_entropy import IGNORE_INDEX, cross_entropy, row_groups
from glm_dist.train.loop import read_metrics
from tests.conftest import FAST, ROOT, TINY, clean_env, run_glm

CUTS = {"crawl": (0, 300), "books": (300, 430), "wiki": (430, 500)}  # documents of the corpus per source
WEIGHTS = {"crawl": 0.6, "books": 0.3, "wiki": 0.1}
SEQ = 256  # wiki: ~230 samples an epoch, so 1,000 steps of 8 run through it ~3.5 times


@pytest.fixture(scope="module")
def mix(corpus, tmp_path_factory):
    """(root, DataConfig of the three sources, its resolved Mixture)."""
    root = tmp_path_factory.mktemp("mix")
    with gzip.open(corpus, "rt") as f:
        docs = f.read().splitlines()
    for name, (a, b) in CUTS.items():
        (root / f"{name}.jsonl").write_text("\n".join(docs[a:b]) + "\n")
    data = DataConfig(
        vocab_size=2048,
        shard_max_bytes=64 * 1024,
        encode_workers=1,
        mixture=[
            {"name": n, "shards_dir": str(root / n), "source": str(root / f"{n}.jsonl"), "weight": w}
            for n, w in WEIGHTS.items()
        ],
    )
    build_missing(data)
    return root, data, resolve_mixture(data, total_tokens=10**6)


def loader(mixture, **kw) -> Loader:
    return Loader(mixture, **{"seq_len": SEQ, "micro_batch_size": 4, "grad_accum_steps": 2, "seed": 7, **kw})


def test_sources_share_the_first_sources_tokenizer(mix):
    _, _, mixture = mix
    manifests = [json.loads((ROOT / d / "manifest.json").read_text()) for d in mixture.shards_dirs]
    assert len({m["tokenizer"]["sha256"] for m in manifests}) == 1
    assert mixture.sizes == tuple(sum(e["num_tokens"] for e in m["splits"]["train"]) for m in manifests)


@pytest.fixture(scope="module")
def thousand_steps(mix):
    """A loader after 1,000 steps of 8 samples, planned only (located, never read), and source -> the
    (epoch, unit) of each sample it drew, in order."""
    ld, seen = loader(mix[2]), defaultdict(list)
    for _ in range(1000):
        ld.next_step(build=False)
        for _, epoch, unit, s in ld.last_samples:
            seen[s].append((epoch, unit))
    return ld, seen


def test_realised_token_shares_within_half_a_point_over_1000_steps(mix, thousand_steps):
    _, _, mixture = mix
    _, seen = thousand_steps
    tokens = {s: len(units) * SEQ for s, units in seen.items()}
    total = sum(tokens.values())
    assert total == 8000 * SEQ
    for s, name in enumerate(mixture.names):
        assert abs(tokens[s] / total - WEIGHTS[name]) <= 0.005, (name, tokens[s] / total)


def test_blended_index_from_any_position_is_the_stepwise_order():
    """The closed form equals the rule run one sample at a time (the next sample to the source whose
    next sample is due first, in exact arithmetic), started anywhere, and no source's count leaves
    w_s x g by 1/2 + N w_s / 2 samples or more -- for GPT-3's Table 2.2 and for random weights."""
    rng = np.random.default_rng(0)
    for weights in ([0.6, 0.22, 0.08, 0.08, 0.02], list(rng.dirichlet(np.ones(7)))):
        blend = BlendedIndex(scaled_weights(weights))
        counts, stepwise = [0] * len(weights), []
        for _ in range(3000):
            s = min(range(len(weights)), key=lambda i: (Fraction(2 * counts[i] + 1, blend.w[i]), i))
            stepwise.append((s, counts[s]))
            counts[s] += 1
        for start, n in ((0, 3000), (1234, 100), (2999, 1)):
            sources, numbers = blend.assign(start, n)
            assert list(zip(sources.tolist(), numbers.tolist())) == stepwise[start : start + n]
        sources, _ = blend.assign(0, 3000)
        drawn = np.cumsum(np.eye(len(weights), dtype=np.int64)[sources], axis=0)
        bound = 0.5 + len(weights) * np.asarray(weights) / 2
        assert (np.abs(drawn - np.arange(1, 3001)[:, None] * np.asarray(weights)[None]) < bound).all()


def test_batches_carry_each_rows_source(mix):
    _, _, mixture = mix
    ld = loader(mixture)
    batches = ld.next_step()
    sources, _ = mixture.blend.assign(0, 8)
    assert [b["source"].tolist() for b in batches] == [sources[:4].tolist(), sources[4:].tolist()]
    assert all(b["source"].dtype == torch.long and b["input_ids"].shape == (4, SEQ) for b in batches)
    assert ld.sources == list(WEIGHTS)
    val = validation_batches(mixture, seq_len=SEQ, micro_batch_size=4, num_batches=2)
    alone = [validation_batches(d, seq_len=SEQ, micro_batch_size=4, num_batches=2) for d in mixture.shards_dirs]
    assert [b["source"].tolist() for b, _ in val] == [[s] * 4 for s, one in enumerate(alone) for _ in one]
    assert all(torch.equal(b["input_ids"], a["input_ids"]) for (b, _), (a, _) in zip(val, sum(alone, [])))


def test_each_epoch_of_each_source_is_a_full_permutation_and_counted_exactly(mix, thousand_steps):
    _, _, mixture = mix
    ld, seen = thousand_steps
    drawn = ld.drawn()
    for s, name in enumerate(mixture.names):
        plan = ld.parts[s]._setup().plan
        epochs = [e for e, _ in seen[s]]
        assert epochs == sorted(epochs)  # a source's next epoch starts after its last one ends
        done = drawn[name]["epoch"]
        assert plan.start(done) <= len(seen[s]) < plan.start(done + 1)
        for e in range(done):
            units = sorted(u for x, u in seen[s] if x == e)
            assert units == list(range(plan.start(e + 1) - plan.start(e)))
        assert drawn[name]["tokens"] == len(seen[s]) * SEQ
        assert drawn[name]["epochs"] == len(seen[s]) * SEQ / mixture.sizes[s]
    assert min(row["epoch"] for row in drawn.values()) >= 3  # every source ran out and reshuffled


def test_a_sources_reshuffle_leaves_the_others_order(mix):
    """crawl's k-th sample is its own sample index's k-th (seeded by its name), whatever wiki holds
    and however often wiki starts a new epoch."""
    _, _, mixture = mix
    weights = (0.5, 0.1, 0.4)  # wiki runs out twice in 150 steps
    one = Mixture(mixture.names, mixture.shards_dirs, mixture.sizes, weights)
    other = Mixture(
        mixture.names, mixture.shards_dirs[:2] + (mixture.shards_dirs[1],), mixture.sizes, weights
    )  # 'wiki' now reads books' documents: other epochs, other reshuffles
    a, b = loader(one), loader(other)
    alone = Loader(mixture.shards_dirs[0], seq_len=SEQ, micro_batch_size=1, seed=mixture.seed(7, 0))._setup()
    k = 0
    for _ in range(150):
        a.next_step(build=False)
        b.next_step(build=False)
        for x, y in zip(a.last_samples, b.last_samples):
            if x[3] < 2:
                assert x == y
            if x[3] == 0:
                located = alone.locate(k)
                assert (located.epoch, located.unit_id) == x[1:3]
                k += 1
    assert (a.drawn()["wiki"]["epoch"], b.drawn()["wiki"]["epoch"]) == (2, 1)


def test_resume_and_elastic_resume_land_on_the_same_next_samples(mix):
    _, _, mixture = mix
    ranks = [loader(mixture, micro_batch_size=2, dp_rank=r, dp_size=2) for r in range(2)]
    for _ in range(3):
        for ld in ranks:
            ld.next_step(build=False)
    state = ranks[0].state_dict()
    resumed = loader(mixture, micro_batch_size=2, dp_rank=1, dp_size=2)
    resumed.load_state_dict(state)
    elastic = loader(mixture, micro_batch_size=4, dp_size=1)  # the same global batch of 8 on one rank
    elastic.load_state_dict(state)
    two = [ld.next_step() for ld in ranks]
    assert all(torch.equal(x[k], y[k]) for x, y in zip(resumed.next_step(), two[1]) for k in x)
    one = elastic.next_step()
    for m in range(2):
        for key in ("input_ids", "source"):
            assert torch.equal(one[m][key], torch.cat([two[0][m][key], two[1][m][key]]))
    changed = Mixture(mixture.names, mixture.shards_dirs, mixture.sizes, (0.5, 0.4, 0.1))
    with pytest.raises(ValueError, match="same sources and weights"):
        loader(changed).load_state_dict(state)


def test_proportional_and_temperature_mixing_follow_t5(mix):
    _, data, mixture = mix
    sizes, cap = np.asarray(mixture.sizes, dtype=float), 80_000
    for mixing, temperature in (("proportional", 1.0), ("temperature", 2.0), ("temperature", 4.0)):
        cfg = DataConfig(
            mixture=[{k: v for k, v in s.items() if k != "weight"} for s in data.mixture],
            mixing=mixing,
            mixing_cap=cap,
            mixing_temperature=temperature,
        )
        rates = np.minimum(sizes, cap) / np.minimum(sizes, cap).sum()  # T5 section 3.5.2: r_m = min(e_m, K) / sum
        rates = rates ** (1 / temperature) / (rates ** (1 / temperature)).sum()
        assert np.allclose(resolve_mixture(cfg, total_tokens=10**6).weights, rates, rtol=1e-12)
    entries = [dict(s) for s in data.mixture]
    entries[2] = {**{k: v for k, v in entries[2].items() if k != "weight"}, "epochs": 2.0}
    entries[0]["weight"] = 0.7 - 2.0 * mixture.sizes[2] / 10**6
    cfg = DataConfig(mixture=entries)
    assert resolve_mixture(cfg, total_tokens=10**6).weights[2] == pytest.approx(2.0 * mixture.sizes[2] / 10**6)


def test_mix_table_counts_what_the_run_draws_and_warns_on_repeats(mix, tmp_path, capsys):
    _, data, mixture = mix
    config = tmp_path / "mix.yaml"
    config.write_text(
        json.dumps(
            {
                "base": TINY,
                "data": {"mixture": data.mixture, "seq_len": SEQ, "max_epochs_warning": 0.6},
                "train": {"max_steps": 100, "micro_batch_size": 8, "grad_accum_steps": 1},
            }
        )
    )
    parser = argparse.ArgumentParser()
    mix_report.add_arguments(parser)
    args = parser.parse_args(["-c", str(config)])
    rows = mix_report.mix_table(load_config(args.config, args.overrides))
    assert [r["source"] for r in rows] == list(WEIGHTS) and sum(r["drawn"] for r in rows) == 800 * SEQ
    assert [r["drawn"] for r in rows] == [v["tokens"] for v in mixture.drawn(800, SEQ).values()]
    assert [r["tokens"] for r in rows] == list(mixture.sizes)
    assert [r["weight"] for r in rows] == list(WEIGHTS.values())
    assert mix_report.run(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["source", "tokens", "weight", "drawn", "epochs"] and out[4].startswith("total")
    over = [r["source"] for r in rows if r["epochs"] > 0.6]  # books: 240 samples of its 90,995 tokens
    assert over == ["books"] and len(out) == 6 and "'books' is repeated 0.68 times" in out[5]


BAD = {
    "unknown key": ([{"name": "a", "shards_dir": "x", "wieght": 1.0}], "unknown key(s) 'wieght' in data.mixture[0]"),
    "both": ([{"name": "a", "shards_dir": "x", "weight": 1.0, "epochs": 2}], "got weight and epochs"),
    "neither": ([{"name": "a", "shards_dir": "x"}], "got neither"),
    "weight <= 0": (
        [{"name": "a", "shards_dir": "x", "weight": 1.0}, {"name": "b", "shards_dir": "y", "weight": 0}],
        "data.mixture[1].weight = 0 ('b') must be a number > 0",
    ),
    "empty path": ([{"name": "a", "shards_dir": "", "weight": 1.0}], "data.mixture[0].shards_dir = '' must be"),
    "duplicate": (
        [{"name": "a", "shards_dir": "x", "weight": 0.5}, {"name": "a", "shards_dir": "y", "weight": 0.5}],
        "names source(s) 'a' more than once",
    ),
    "sum": (
        [{"name": "a", "shards_dir": "x", "weight": 0.6}, {"name": "b", "shards_dir": "y", "weight": 0.3}],
        "weights sum to 0.9, not 1",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_malformed_mixture_is_one_line(case, tmp_path):
    mixture, words = BAD[case]
    config = tmp_path / "bad.yaml"
    config.write_text(json.dumps({"base": TINY, "data": {"mixture": mixture}}))
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert words in str(err.value) and str(config) in str(err.value) and "\n" not in str(err.value)


def test_normalize_weights_divides_by_the_sum(tmp_path):
    config = tmp_path / "norm.yaml"
    config.write_text(json.dumps({"base": TINY, "data": {"normalize_weights": True, "mixture": BAD["sum"][0]}}))
    load_config(config)  # accepted; the shares are divided when resolved


def test_glm_config_show_refuses_a_malformed_mixture_with_exit_2(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(json.dumps({"base": TINY, "data": {"mixture": BAD["both"][0]}}))
    proc = subprocess.run(
        [sys.executable, "-m", "glm_dist.cli", "config", "show", "-c", str(config)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "exactly one of weight" in proc.stderr


def test_sources_with_other_tokenizers_or_no_training_tokens_are_refused(mix, tmp_path):
    root, data, _ = mix
    prepare_shards(source=str(root / "wiki.jsonl"), out_dir=str(tmp_path / "own"), vocab_size=1000, workers=1)
    # a set whose training split is empty (glm data tokenize now refuses to write one; an older version's)
    held = Path(shutil.copytree(data.mixture[2]["shards_dir"], tmp_path / "held"))
    manifest = json.loads((held / "manifest.json").read_text())
    manifest["splits"]["train"] = []
    (held / "manifest.json").write_text(json.dumps(manifest))
    for folder, words in (("own", "use different tokenizers (gpt2 byte-bpe, 2048 tokens"), ("held", "no training")):
        entries = [*data.mixture[:2], {**data.mixture[2], "shards_dir": str(tmp_path / folder)}]
        with pytest.raises(GlmError, match=words.replace("(", r"\(")) as err:
            resolve_mixture(DataConfig(mixture=entries), total_tokens=10**6)
        assert "\n" not in str(err.value)
    with pytest.raises(ShardSetError, match="gives no 'source'"):
        build_missing(DataConfig(mixture=[{"name": "gone", "shards_dir": str(tmp_path / "gone"), "weight": 1.0}]))


def test_row_groups_add_each_sources_tokens_of_a_gathered_loss(mix):
    """MLM's layout, (B, K) gathered positions with padding: the per-source sums are the per-row
    NLL and counts of the rows of that source, and add up to the loss; a loss whose tokens are not
    batch-major is refused."""
    batch = loader(mix[2]).next_step()[0]
    labels = batch["labels"][:, ::7].clone()  # (4, 37) real targets, the last two of row 1 padding
    labels[1, -2:] = IGNORE_INDEX
    logits = torch.randn(*labels.shape, 2048, generator=torch.Generator().manual_seed(0))
    with row_groups(batch["source"], 3) as sums:
        nll = cross_entropy(logits, labels)
    rows = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(4, -1)
    for s in range(3):
        mine = batch["source"] == s
        assert sums[s].tolist() == pytest.approx([float(rows[mine].sum()), float((labels[mine] != IGNORE_INDEX).sum())])
    assert float(sums[:, 0].sum()) == pytest.approx(float(nll))
    with pytest.raises(ValueError, match="not batch-major"), row_groups(batch["source"], 3):
        cross_entropy(logits.flatten(0, 1)[:-2], labels.flatten()[:-2])  # 146 tokens over 4 rows


RUN = [
    *FAST,
    "model.vocab_size=2048",
    "train.max_steps=4",
    "train.grad_accum_steps=2",
    "train.eval_interval=2",
    "train.eval_batches=2",
    "train.save_interval=0",
    "logging.log_interval=1",
]  # global batch 8 of 64 tokens


@pytest.fixture(scope="module")
def mixture_run(mix, tmp_path_factory):
    """(the run's config file, its out_dir): the tiny GPT trained 4 steps on the three sources."""
    _, data, _ = mix
    root = tmp_path_factory.mktemp("mixrun")
    config = root / "mix.yaml"
    config.write_text(json.dumps({"base": TINY, "data": {"mixture": data.mixture}}))
    run_glm(["train", "-c", str(config), *RUN, f"train.out_dir={root / 'out'}"])
    return config, root / "out"


def test_train_loss_per_source_weighted_by_its_tokens_is_the_steps_loss(mix, mixture_run):
    """Every step (log_interval 1): the sources that gave rows have ``loss/<source>``, the others
    none, and their mean weighted by the tokens each predicted (its rows x 64: packed CLM) is the
    logged loss."""
    _, _, mixture = mix
    rows = read_metrics(mixture_run[1])
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        sources, _ = mixture.blend.assign((row["step"] - 1) * 8, 8)
        tokens = np.bincount(sources, minlength=3) * 64
        assert [f"loss/{n}" in row for n in mixture.names] == [bool(t) for t in tokens], row
        weighted = sum(t * row[f"loss/{n}"] for n, t in zip(mixture.names, tokens) if t) / tokens.sum()
        assert weighted == pytest.approx(row["loss"], rel=1e-6)


def test_validation_per_source_matches_its_own_split_and_glm_eval(mix, mixture_run):
    """Each validation row has loss, perplexity and bits per byte per source, and the mixture's
    loss is their mean under the mixture weights; the last row's wiki loss is the checkpoint's NLL
    on wiki's validation split computed here directly, and glm eval gives the same per-source rows."""
    _, _, mixture = mix
    config, out = mixture_run
    val = read_metrics(out, "val")
    assert [r["step"] for r in val] == [0, 2, 4]
    for row in val:
        for key in ("loss", "perplexity", "bits_per_byte"):
            assert all(f"val_{key}/{n}" in row for n in mixture.names), row
        losses = [row[f"val_loss/{n}"] for n in mixture.names]
        assert row["val_loss"] == pytest.approx(float(np.dot(mixture.weights, losses)), rel=1e-9)
    model, _ = load_checkpoint_model(out / "checkpoints/step_00000004")
    nll = count = 0.0
    for batch, _ in validation_batches(mixture.shards_dirs[2], seq_len=64, micro_batch_size=4, num_batches=2):
        with torch.no_grad():
            logits = model(batch["input_ids"])
        nll += torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum")
        count += int((batch["labels"] != -100).sum())
    assert val[-1]["val_loss/wiki"] == pytest.approx(float(nll) / count, rel=1e-5)
    result = evaluate_checkpoint(load_config(config, RUN), out / "checkpoints/step_00000004")
    for key in ("loss", *(f"{k}/{n}" for k in ("loss", "bits_per_byte", "tokens") for n in mixture.names)):
        assert result[key] == pytest.approx(val[-1][f"val_{key}"], rel=1e-5), key


def test_data_card_holds_each_sources_tokens_and_epochs(mix, mixture_run):
    _, _, mixture = mix
    card = json.loads((mixture_run[1] / "data_card.json").read_text())
    drawn = mixture.drawn(4 * 8, 64)
    assert [s["name"] for s in card["sources"]] == list(mixture.names) and card["step"] == 4
    for source, size, weight in zip(card["sources"], mixture.sizes, mixture.weights):
        expected = drawn[source["name"]]
        assert (source["tokens"], source["epochs"]) == (expected["tokens"], expected["epochs"])
        assert (source["tokens_available"], source["weight"]) == (size, weight)
    assert sum(s["tokens"] for s in card["sources"]) == card["tokens"] == 4 * 8 * 64


def test_a_run_on_one_shard_set_logs_nothing_per_source(mix, tmp_path):
    run_glm(
        [
            "train",
            "-c",
            TINY,
            *RUN,
            "train.max_steps=2",
            "train.eval_batches=1",
            f"data.shards_dir={mix[2].shards_dirs[0]}",
            f"train.out_dir={tmp_path}",
        ]
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in rows} >= {"train", "val"}
    assert not [k for r in rows for k in r if "/" in k] and not (tmp_path / "data_card.json").exists()
