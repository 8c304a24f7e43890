"""Data mixtures (issue 32) under pipeline and tensor parallelism, with the token-shard objectives
beyond CLM, and feeding XLNet's streams.

The sources are real text: the session's embedded corpus (conftest ``shards_dir``) and 130 of the
pydoc documents (conftest ``corpus``) tokenized with its tokenizer.json.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from data_pipeline.tokenize.prepare import prepare_shards
from glm_dist.config.schema import DataConfig
from glm_dist.data.loader import Loader
from glm_dist.data.mixture import Mixture, resolve_mixture
from glm_dist.data.plan import from_runs
from glm_dist.errors import GlmError
from tests.conftest import TINY, run_glm, train_losses
from tests.test_parallel import PIPE, PIPE_TOL


def second_source(corpus: str, first: str, out) -> str:
    """Documents 300..430 of the pydoc corpus as a shard set with ``first``'s tokenizer."""
    with gzip.open(corpus, "rt") as f:
        docs = f.read().splitlines()[300:430]
    (out / "books.jsonl").write_text("\n".join(docs) + "\n")
    profile = json.loads((Path(first) / "manifest.json").read_text())["tokenizer"]["profile"]
    prepare_shards(
        source=str(out / "books.jsonl"),
        out_dir=str(out / "books"),
        tokenizer=f"{first}/tokenizer.json",
        profile=profile,
        shard_max_bytes=64 * 1024,
        workers=1,
    )
    return str(out / "books")


def mixed(first: str, second: str) -> list[dict]:
    """data.mixture: ``first`` 70 %, ``second`` 30 % of the training tokens."""
    return [
        {"name": "crawl", "shards_dir": first, "weight": 0.7},
        {"name": "books", "shards_dir": second, "weight": 0.3},
    ]


@pytest.fixture(scope="module")
def mix_config(shards_dir, corpus, tmp_path_factory) -> str:
    """A tiny GPT config that trains on a 70/30 mixture of two sources."""
    root = tmp_path_factory.mktemp("mixpar")
    config = root / "mix.json"
    mixture = mixed(shards_dir, second_source(corpus, shards_dir, root))
    config.write_text(json.dumps({"base": TINY, "data": {"mixture": mixture}}))
    return str(config)


STEPS = ["train.max_steps=3"]


@pytest.fixture(scope="module")
def one_process(mix_config, tmp_path_factory) -> tuple[list[float], Path]:
    """Global batch 2 x 8 = 16 sequences per step, one process: (losses, out_dir)."""
    out = tmp_path_factory.mktemp("mix-ref")
    run_glm(["train", "-c", mix_config, *PIPE, *STEPS, "train.grad_accum_steps=8", f"train.out_dir={out}"])
    return train_losses(out), out


@pytest.mark.slow
@pytest.mark.parametrize("layout", [["parallel.pipeline_stages=2"], ["parallel.tensor_parallel=2"]], ids=["pp2", "tp2"])
def test_a_mixture_trains_under_pipeline_and_tensor_parallelism_with_the_one_process_losses(
    layout, mix_config, one_process, tmp_path
):
    """The pipeline's last stage reads the same blended rows as one process (its middle stages read
    nothing); the tensor ranks share tensor rank 0's read, ``source`` included."""
    run_glm(
        ["train", "-c", mix_config, *PIPE, *STEPS, "train.grad_accum_steps=8", *layout, f"train.out_dir={tmp_path}"],
        nproc=2,
    )
    losses, reference = train_losses(tmp_path), one_process[0]
    assert len(losses) == len(reference) == 3
    assert max(abs(a - b) for a, b in zip(losses, reference)) <= PIPE_TOL, (losses, reference)
    ours, theirs = train_rows(tmp_path), train_rows(one_process[1])
    assert ours[-1]["tokens/crawl"] + ours[-1]["tokens/books"] == 3 * 16 * 64
    per_source = [{k: v for k, v in row.items() if k.startswith("loss/")} for row in ours]
    if "parallel.pipeline_stages=2" in layout:  # the last stage's loss never sees the rows' sources: none reported
        assert per_source == [{}] * 3
    else:  # the broadcast batch keeps "source": the one process's per-source losses
        expected = [{k: v for k, v in row.items() if k.startswith("loss/")} for row in theirs]
        assert [sorted(x) for x in per_source] == [sorted(x) for x in expected] == [["loss/books", "loss/crawl"]] * 3
        assert all(abs(x[k] - y[k]) <= PIPE_TOL for x, y in zip(per_source, expected) for k in x)


def train_rows(out) -> list[dict]:
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"]


@pytest.mark.slow
def test_a_data_position_of_another_mixture_is_one_line_and_exit_2(mix_config, one_process, tmp_path):
    """Resuming the one-process run's checkpoint with other weights would draw another order."""
    reference = json.loads(Path(mix_config).read_text())
    config = tmp_path / "other.json"
    mixture = [{**s, "weight": w} for s, w in zip(reference["data"]["mixture"], (0.6, 0.4))]
    config.write_text(json.dumps({**reference, "data": {"mixture": mixture}}))
    proc = run_glm(
        [
            "train",
            "-c",
            str(config),
            *PIPE,
            "train.max_steps=4",
            "train.grad_accum_steps=8",
            f"train.resume={one_process[1]}/checkpoints/step_00000003",
            f"train.out_dir={tmp_path / 'run'}",
        ],
        check=False,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    assert "the mixture crawl=" in proc.stderr and "resume with the same sources and weights" in proc.stderr


def test_every_position_mismatch_is_a_one_line_glm_error(shards_dir):
    from glm_dist.data.loader import PositionMismatch

    kw = dict(seq_len=64, micro_batch_size=2, seed=1)
    state = Loader(shards_dir, **kw).state_dict()
    cases = {
        "format": {**state, "format": "v0"},
        "objective": {**state, "objective": "mlm"},
        "streams": {**state, "streams": 4},
        "seed": {**state, "seed": 2},
        "mixture": {**state, "mixture": {"names": ["a", "b"], "weights": [1, 2]}},
    }
    for key, saved in cases.items():
        with pytest.raises(PositionMismatch) as err:
            Loader(shards_dir, **kw).load_state_dict(saved)
        assert isinstance(err.value, GlmError) and "\n" not in str(err.value), key
    assert "saved for the mixture a=1, b=2, this run has one shard set" in str(err.value)


def source_pair(shards, profile: str, corpus: str, out) -> Mixture:
    """The 70/30 mixture of the pydoc corpus in ``profile``'s shards and the 130 documents in its tokenizer."""
    first = shards(profile)
    return resolve_mixture(DataConfig(mixture=mixed(first, second_source(corpus, first, out))), total_tokens=10**6)


@pytest.mark.parametrize("objective, profile", [("mlm", "roberta"), ("span_corruption", "t5")])
def test_mlm_and_span_corruption_rows_are_their_sources_own_samples(objective, profile, shards, corpus, tmp_path):
    """Row r of step 1 is global sample 8 + r: the blend's source, that source's sample (its mask or
    spans drawn by its own seed and the sample's number there), as the source's own loader builds it."""
    mixture = source_pair(shards, profile, corpus, tmp_path)
    kw = dict(objective=objective, seq_len=64)
    ld = Loader(mixture, micro_batch_size=4, grad_accum_steps=2, seed=3, **kw)
    ld.next_step(build=False)
    batches = ld.next_step()
    sources, numbers = mixture.blend.assign(8, 8)
    assert torch.cat([b["source"] for b in batches]).tolist() == sources.tolist() and set(sources.tolist()) == {0, 1}
    alone = [
        Loader(root, micro_batch_size=1, seed=mixture.seed(3, s), **kw) for s, root in enumerate(mixture.shards_dirs)
    ]
    for row, (s, k) in enumerate(zip(sources.tolist(), numbers.tolist())):
        alone[s].samples = k
        own, mixed_row = alone[s].next_step()[0], {key: v[row % 4] for key, v in batches[row // 4].items()}
        for key, value in own.items():  # a row of the mixed batch: the sample, then the batch's padding
            assert torch.equal(mixed_row[key][..., : value.shape[-1]], value[0]), (objective, key, row)


def test_xlnet_streams_draw_each_next_unit_from_the_mixture(shards, corpus, tmp_path):
    """Stream b's t-th unit is blend position b + t: step t's rows mix the sources as the blend's
    positions [t, t + 8) do, and stream b's units of a source are that source's own stream b in
    order, its memory per source (row id s x 8 + b). Resume at another data-parallel size lands on
    the same next rows; the tokens drawn per source are counted exactly."""
    mixture = source_pair(shards, "xlnet", corpus, tmp_path)
    kw = dict(objective="plm", seq_len=32, grad_accum_steps=1, streams=True)
    two = [Loader(mixture, micro_batch_size=4, dp_rank=r, dp_size=2, seed=6, **kw) for r in range(2)]
    alone = [
        Loader(root, micro_batch_size=8, seed=mixture.seed(6, s), **kw)._setup()
        for s, root in enumerate(mixture.shards_dirs)
    ]
    taken = np.zeros((2, 8), dtype=np.int64)  # units of source s stream b has taken
    for t in range(12):
        located = [two[0].locate(b) for b in range(8)]
        batches = [ld.next_step()[0] for ld in two]
        sources = torch.cat([b["source"] for b in batches]).tolist()
        assert sources == mixture.blend.assign(t, 8)[0].tolist()
        assert torch.cat([b["rows"] for b in batches]).tolist() == [s * 8 + b for b, s in enumerate(sources)]
        for b, (s, loc) in enumerate(zip(sources, located)):
            own = alone[s].locate(b, int(taken[s, b]))
            assert (loc.epoch, loc.unit_id) == (own.epoch, own.unit_id)
            assert np.array_equal(from_runs(loc.unit.leaves[0]), from_runs(own.unit.leaves[0]))
            taken[s, b] += 1
    assert (taken > 0).all() and {n: d["tokens"] for n, d in two[0].drawn().items()} == {
        name: int(taken[s].sum()) * 32 for s, name in enumerate(mixture.names)
    }
    elastic = Loader(mixture, micro_batch_size=8, seed=6, **kw)
    elastic.load_state_dict(two[1].state_dict())
    one, split = elastic.next_step()[0], [ld.next_step()[0] for ld in two]
    for key in ("input_ids", "source", "rows"):
        assert torch.equal(one[key], torch.cat([b[key] for b in split])), key
