"""Scores measured the way the papers measure them: lm-eval tasks on the live model during
`glm train` (glm_dist/eval/in_loop.py), contamination-aware scores from the crawl pipeline's
dirty items (glm_dist/eval/contamination.py), and perplexity per token, word and byte of whole
documents in sliding windows (glm_dist/eval/perplexity.py)."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tokenizers import Tokenizer

from data_pipeline.tokenize.prepare import is_validation, read_documents
from glm_dist.eval.perplexity import document_nll, sliding_windows
from tests.conftest import FAST, ROOT, TINY, clean_env, run_glm

LIMIT = 8  # cloze documents per in-loop evaluation
COMMON = [*FAST, "data.vocab_size=2048", "model.vocab_size=2048", "eval.limit=8", "eval.batch_size=4"]


@pytest.fixture(scope="module")
def tasks(corpus, tmp_path_factory) -> dict[str, Path]:
    """The offline cloze (what glm data eval-tasks builds) and a one-document copy of it given as a
    task YAML path: fewer documents than ranks."""
    from glm_dist.eval.tasks import build_tasks

    out = tmp_path_factory.mktemp("tasks")
    build_tasks(out / "suite", ["pydoc_cloze"], documents=read_documents(corpus))
    one = out / "one"
    one.mkdir()
    (one / "test.jsonl").write_text((out / "suite/pydoc_cloze/test.jsonl").read_text().splitlines()[0] + "\n")
    config = yaml.safe_load((out / "suite/pydoc_cloze/pydoc_cloze.yaml").read_text())
    files = {"test": str(one / "test.jsonl"), "train": config["dataset_kwargs"]["data_files"]["train"]}
    config.update(task="pydoc_cloze_one", dataset_kwargs={"data_files": files})
    (one / "pydoc_cloze_one.yaml").write_text(yaml.safe_dump(config))
    return {"suite": out / "suite", "one": one / "pydoc_cloze_one.yaml"}


def _rows(out: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


@pytest.fixture(scope="module")
def one_process(shards_dir, tasks, tmp_path_factory) -> Path:
    """A tiny GPT-2 trained 20 steps in one process, scored on the cloze every 10 steps."""
    out = tmp_path_factory.mktemp("in-loop-1")
    run_glm(
        [
            "train",
            "-c",
            TINY,
            *COMMON,
            f"data.shards_dir={shards_dir}",
            "train.max_steps=20",
            "train.save_interval=10",
            f"train.out_dir={out}",
            "eval.tasks=[pydoc_cloze]",
            "eval.tasks_every=10",
            f"eval.include_path={tasks['suite']}",
        ]
    )
    return out


def _glm_eval_scores(ckpt: Path, task: str, include_path: Path) -> dict:
    """What `glm eval --checkpoint CKPT --tasks TASK` reports (run_tasks is what it runs)."""
    from glm_dist.eval.harness import run_tasks

    results = run_tasks(str(ckpt), [task], include_path=str(include_path), limit=LIMIT, batch_size=4)["results"]
    return {
        f"{task}/{k.split(',')[0]}": v for k, v in results[task].items() if k.endswith(",none") and "stderr" not in k
    }


def _assert_same(row: dict, expected: dict) -> None:
    assert expected and all(row[k] == pytest.approx(v, rel=1e-4) for k, v in expected.items()), (row, expected)


@pytest.mark.slow
def test_in_loop_scores_equal_glm_eval_on_the_checkpoint_of_the_step_and_stay_out_of_tokens_per_s(one_process, tasks):
    rows = _rows(one_process, "tasks")
    assert [r["step"] for r in rows] == [10, 20]
    train = {r["step"]: r for r in _rows(one_process, "train")}
    _assert_same(rows[0], _glm_eval_scores(one_process / "checkpoints/step_00000010", "pydoc_cloze", tasks["suite"]))
    for row in rows:
        assert row["pydoc_cloze/ranks"] == 1 and row["seconds"] > 0
        for step in (row["step"], row["step"] + 1):  # the steps either side of the evaluation
            if step in train:
                step_seconds = 4 * 64 / train[step]["tokens_per_s"]  # micro batch 4 x 64 tokens
                assert step_seconds < 0.5 * row["seconds"], (step, step_seconds, row["seconds"])
    assert rows[0]["pydoc_cloze/perplexity"] != rows[1]["pydoc_cloze/perplexity"]  # the live model, not a copy


@pytest.mark.slow
def test_in_loop_scores_under_torchrun_split_the_documents_and_idle_ranks_wait_at_the_barrier(
    shards_dir, tasks, tmp_path
):
    run_glm(
        [
            "train",
            "-c",
            TINY,
            *COMMON,
            f"data.shards_dir={shards_dir}",
            "train.max_steps=10",
            f"train.out_dir={tmp_path}",
            f"eval.tasks=[pydoc_cloze,{tasks['one']}]",
            "eval.tasks_every=5",
            f"eval.include_path={tasks['suite']}",
        ],
        nproc=2,
    )
    rows = _rows(tmp_path, "tasks")
    assert [r["step"] for r in rows] == [5, 10]
    # the cloze's 8 documents split over both ranks; the one-document task on rank 0, rank 1 idle
    assert all(r["pydoc_cloze/ranks"] == 2 and r["pydoc_cloze_one/ranks"] == 1 for r in rows)
    ckpt = tmp_path / "checkpoints/step_00000010"
    _assert_same(rows[1], _glm_eval_scores(ckpt, "pydoc_cloze", tasks["suite"]))
    _assert_same(rows[1], _glm_eval_scores(ckpt, "pydoc_cloze_one", tasks["one"].parent))


WAIT = """
import json, os, sys, time
import torch.distributed as dist
from glm_dist.parallel import comm
dist.init_process_group("gloo", rank=int(sys.argv[1]), world_size=2)
comm.init_side_group(30.0)
if sys.argv[1] == "1":
    time.sleep(2.5)  # still evaluating when rank 0's wait runs out
print(json.dumps(comm.wait_for_ranks(1.0)))
"""


def test_the_barrier_after_an_evaluation_names_the_rank_that_did_not_arrive():
    from glm_dist.parallel.distributed import _free_port

    env = clean_env() | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WAIT, str(r)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    got = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert got == [[1], None], outs  # rank 0 names rank 1; rank 1 then finds rank 0 gone


def test_in_loop_tasks_are_refused_where_a_rank_holds_no_whole_model():
    from glm_dist.config.checks import validate
    from glm_dist.config.loader import ConfigError, load_config

    cfg = load_config(TINY, ["eval.tasks=[pydoc_cloze]", "eval.tasks_every=10", "parallel.pipeline_stages=2"])
    with pytest.raises(ConfigError, match="score its checkpoints with glm eval --tasks"):
        validate(cfg, world_size=2)
    with pytest.raises(ConfigError, match="go together"):
        validate(load_config(TINY, ["eval.tasks=[pydoc_cloze]"]))


# -- contamination-aware scores ---------------------------------------------------------------------
@pytest.mark.slow
def test_contamination_splits_every_score_into_the_pipelines_clean_and_dirty_items(
    corpus, tasks, one_process, tmp_path
):
    test_rows = [json.loads(line) for line in (tasks["suite"] / "pydoc_cloze/test.jsonl").read_text().splitlines()]
    limit = 24
    planted = [r for r in test_rows[:limit] if len(r["context"].split()) >= 20][:4]
    assert len(planted) == 4
    # a small crawl: pretraining documents (not held out) and four pages quoting a test item each
    docs = [d for d in read_documents(corpus) if not is_validation(d["id"], 50)][:12]
    crawl = [{"id": d["id"], "text": d["text"]} for d in docs]
    crawl += [
        {
            "id": f"leak{i}",
            "text": f"{docs[i]['text'][:1500]}\n\n{r['context']} {r['target']}.\n\n{docs[i + 4]['text'][:1500]}",
        }
        for i, r in enumerate(planted)
    ]
    with gzip.open(tmp_path / "crawl.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(d) + "\n" for d in crawl)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm_dist.cli",
            "data",
            "run",
            "-c",
            str(ROOT / "configs/data/fineweb.yaml"),
            f"input={tmp_path}/crawl.jsonl.gz",
            f"benchmarks={tasks['suite']}/pydoc_cloze/test.jsonl",
            f"output={tmp_path}/crawl",
            "stages=[]",
            "dedup.exact=false",
            "dedup.minhash=false",
            "workers=1",
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "crawl/contamination.json").read_text())["benchmarks"]["test"]
    dirty = set(report["dirty_ids"])
    assert {r["id"] for r in planted} <= dirty and len(report["dirty_ids"]) == report["dirty"]
    ckpt = one_process / "checkpoints/step_00000020"
    run_glm(
        [
            "eval",
            "--checkpoint",
            str(ckpt),
            "--tasks",
            "pydoc_cloze",
            "--include-path",
            str(tasks["suite"]),
            "--limit",
            str(limit),
            "--contamination",
            str(tmp_path / "crawl/contamination.json"),
            "--out",
            str(tmp_path / "scores.json"),
        ]
    )
    scores = json.loads((tmp_path / "scores.json").read_text())
    split = scores["contamination"]["tasks"]["pydoc_cloze"]
    n_dirty = sum(r["id"] in dirty for r in test_rows[:limit])
    assert [split[s]["items"] for s in ("all", "clean", "dirty")] == [limit, limit - n_dirty, n_dirty]
    assert n_dirty >= 4
    assert split["all"]["acc,none"] == pytest.approx(scores["results"]["pydoc_cloze"]["acc,none"])
    assert split["all"]["perplexity,none"] == pytest.approx(
        scores["results"]["pydoc_cloze"]["perplexity,none"], rel=1e-9
    )
    w = n_dirty / limit  # all = the item-weighted mix of clean and dirty (perplexity: of its logarithm)
    mix = (1 - w) * split["clean"]["acc,none"] + w * split["dirty"]["acc,none"]
    assert split["all"]["acc,none"] == pytest.approx(mix)
    assert math.log(split["all"]["perplexity,none"]) == pytest.approx(
        (1 - w) * math.log(split["clean"]["perplexity,none"]) + w * math.log(split["dirty"]["perplexity,none"])
    )


# -- perplexity per token, word and byte, in sliding windows ------------------------------------------
@pytest.mark.parametrize("stride", [1, 5, 12, 16])
def test_every_token_is_scored_exactly_once_at_any_stride(stride):
    for n in (1, 15, 16, 17, 53):
        windows = sliding_windows(n, context=16, stride=stride)
        scored = [t for _, end, k in windows for t in range(end - k + 1, end + 1)]  # positions of [prefix] + tokens
        assert scored == list(range(1, n + 1))
        assert all(end - start <= 16 and start >= 0 for start, end, _ in windows)
        assert all(end - k + 1 - start >= 16 - stride for start, end, k in windows[1:])  # context before each


@pytest.fixture(scope="module")
def small_lm(shards_dir):
    """A random tiny GPT-2 (context 16) with the corpus' tokenizer."""
    from glm_dist.families.gpt.model import GPT, gpt_config

    torch.manual_seed(0)
    model = GPT(gpt_config("tiny", n_layer=2, d_model=32, n_head=2, vocab_size=2048, context_length=16)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model, Tokenizer.from_file(f"{shards_dir}/tokenizer.json")


TEXT = (
    "Return a new sorted list from the items in iterable. Has two optional arguments which must be specified "
    "as keyword arguments. key specifies a function of one argument that is used to extract a comparison key "
    "from each element in iterable. reverse is a boolean value; if set to True, the list elements are sorted as "
    "if each comparison were reversed."
)


def test_stride_equal_to_the_context_is_the_non_overlapping_evaluation(small_lm):
    """Disjoint chunks of 16 inputs, each predicting its next tokens from itself only; a last partial
    chunk reads the 16 inputs before its end (lm-eval's disjoint windows do the same)."""
    model, tok = small_lm
    ids = tok.encode(TEXT).ids
    x = torch.tensor([0, *ids])

    def chunk_nll(a: int, b: int, scored: int) -> float:  # inputs x[a:b], the last `scored` predictions
        with torch.no_grad():
            lp = torch.log_softmax(model(x[None, a:b]), -1)[0, b - a - scored :]
        return -lp.gather(-1, x[b - scored + 1 : b + 1, None]).sum().item()

    for n in (48, len(ids)):  # three whole chunks, and a partial last one
        ends = list(range(16, n + 1, 16)) + ([n] if n % 16 else [])
        expected = sum(chunk_nll(max(0, end - 16), end, end - start) for start, end in zip([0, *ends], ends))
        assert len(ends) >= 3
        got = document_nll(model, ids[:n], prefix_id=0, context=16, stride=16, batch_size=2)
        assert got == pytest.approx(expected, abs=1e-3)
    assert document_nll(model, ids, prefix_id=0, context=16, stride=4) != pytest.approx(expected, abs=1e-2)


@pytest.mark.parametrize("stride", [1, 6, 16])
def test_sliding_window_likelihood_equals_the_harness_rolling_likelihood(small_lm, stride):
    from glm_dist.eval.harness import GlmLM

    model, tok = small_lm
    lm = GlmLM(model=model, tokenizer=tok, eot_id=0, rolling_stride=stride)

    class Req:
        args = (TEXT,)

    rolling = lm.loglikelihood_rolling([Req()])[0]
    assert -document_nll(model, tok.encode(TEXT).ids, prefix_id=0, context=16, stride=stride) == pytest.approx(
        rolling, abs=1e-3
    )


@pytest.mark.slow
def test_glm_eval_reports_token_word_and_byte_perplexity_as_lm_eval_rolling_tasks_do(one_process, shards_dir, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from glm_dist.data.shards import read_manifest, read_shard, shard_urls
    from glm_dist.eval.harness import GlmLM
    from glm_dist.hf.export import export_checkpoint

    ckpt = one_process / "checkpoints/step_00000020"
    ev = run_glm(
        [
            "eval",
            "-c",
            TINY,
            *COMMON,
            f"data.shards_dir={shards_dir}",
            "--checkpoint",
            str(ckpt),
            "--documents",
            "3",
            "--stride",
            "64",
        ]
    )
    docs = json.loads(ev.stdout[ev.stdout.index("{") :])["documents"]
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    first = read_shard(shard_urls(shards_dir, read_manifest(shards_dir), "validation")[0])[:3]
    texts = [tok.decode(d.tokens.tolist()) for d in first]
    assert docs["documents"] == 3 and docs["tokens"] == sum(len(d.tokens) for d in first)
    assert max(len(d.tokens) for d in first) > 2 * 256  # documents longer than the context
    assert docs["words"] < docs["tokens"] < docs["bytes"] and docs["stride"] == 64
    assert docs["token_perplexity"] == pytest.approx(math.exp(docs["nll"] / docs["tokens"]))
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "rolling.yaml").write_text(
        yaml.safe_dump(
            {
                "task": "val_rolling",
                "dataset_path": "json",
                "dataset_kwargs": {"data_files": {"test": str(tmp_path / "docs.jsonl")}},
                "test_split": "test",
                "output_type": "loglikelihood_rolling",
                "doc_to_text": "",
                "doc_to_target": "{{text}}",
                "metric_list": [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")],
            }
        )
    )
    results = simple_evaluate(
        model=GlmLM(str(ckpt), rolling_stride=64),
        tasks=["val_rolling"],
        bootstrap_iters=0,
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
    )
    theirs = results["results"]["val_rolling"]
    for metric in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert docs[metric] == pytest.approx(theirs[f"{metric},none"], rel=1e-4), metric
    # at stride = context: the windows of lm-eval's hf model on the transformers export
    export_checkpoint(str(ckpt), tmp_path / "hf")
    hf = HFLM(pretrained=str(tmp_path / "hf"), dtype="float32", device="cpu", batch_size=4)

    class Req:
        def __init__(self, text):
            self.args = (text,)

    from glm_dist.eval.stream import load_decoder

    lm = load_decoder(str(ckpt))
    for text, (ll,) in zip(texts, [hf.loglikelihood_rolling([Req(t)]) for t in texts]):
        ours = document_nll(lm.model, tok.encode(text).ids, prefix_id=lm.eos_id, context=256, stride=256)
        assert -ours == pytest.approx(ll, rel=1e-5, abs=1e-3)
