"""lm-evaluation-harness as the scoring engine (glm_dist/eval/harness.py), the offline tasks
(data_pipeline/tasks, glm_dist/eval/tasks) and `glm generate`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tokenizers import Tokenizer

from data_pipeline.tokenize.prepare import is_validation, read_documents
from glm_dist.eval.harness import GlmLM, _from_json, _to_json
from glm_dist.families.gpt.model import GPT, gpt_config
from tests.conftest import FAST, ROOT, TINY, clean_env, run_glm

TASKS = "pydoc_cloze,wordnet_mc,docstring_mc,pydoc_rolling,pydoc_generate"
# GPT-2 / GPT-3 style. Not wordnet_qa_beam: lm-eval's hf stopping criteria track one row, so under beam search
# the first stop sequence in the top candidate ends every hypothesis; ours ends only the one containing it.
NEW = "doc_summary,translation_de,wordnet_qa,wordnet_mc_unconditional"


class Req:  # what lm-eval hands a model: an Instance's args
    def __init__(self, *args):
        self.args = args


@pytest.fixture(scope="module")
def live(shards_dir) -> GlmLM:
    """A random tiny GPT-2 (context 24) with the embedded corpus' tokenizer, scored in batches of 3."""
    torch.manual_seed(0)
    model = GPT(gpt_config("tiny", n_layer=2, d_model=32, n_head=2, vocab_size=2048, context_length=24)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)  # outputs that vary from token to token
    return GlmLM(model=model, tokenizer=Tokenizer.from_file(f"{shards_dir}/tokenizer.json"), eot_id=0, batch_size=3)


def _manual_loglikelihood(lm: GlmLM, context: list[int], cont: list[int]) -> float:
    ids = torch.tensor([context + cont])
    with torch.no_grad():
        lp = torch.log_softmax(lm.model(ids[:, :-1]), -1)[0]
    return sum(lp[len(context) - 1 + i, t].item() for i, t in enumerate(cont))


def test_loglikelihood_scores_context_and_continuation_in_one_pass_whatever_the_batch(live):
    pairs = [("Return the", " number"), ("def open(file", ", mode)"), ("", "hello world"), ("x", " y z w")]
    got = live.loglikelihood([Req(*p) for p in pairs])
    one_by_one = [live.loglikelihood([Req(*p)])[0] for p in pairs]
    assert [g[1] for g in got] == [o[1] for o in one_by_one]
    for (ll, _), (ll1, _), (ctx, cont) in zip(got, one_by_one, pairs):
        assert ll == pytest.approx(ll1, abs=1e-4)
        c, t = ([0], live.tok_encode(cont)) if not ctx else live._encode_pair(ctx, cont)
        assert ll == pytest.approx(_manual_loglikelihood(live, c, t), abs=1e-4)


def test_choices_of_one_context_score_from_its_cache_as_they_do_without_it(live):
    context = "Definition: a building where books are kept\nWord:"
    choices = [" library", " shelf", " reading room", " a", " archive of the city"]
    reqs = [Req(context, c) for c in choices] + [Req("Return the", " number"), Req("", "hello")]
    calls = []
    hook = live.model.register_forward_hook(lambda m, args, out: calls.append(args[0].shape))
    try:
        cached = live.loglikelihood(reqs)
    finally:
        hook.remove()
    uncached = GlmLM(model=live.model, tokenizer=live.tok, eot_id=0, batch_size=3, prefix_cache="false")
    plain = uncached.loglikelihood(reqs)
    assert [g for _, g in cached] == [g for _, g in plain]
    for (a, _), (b, _) in zip(cached, plain):
        assert a == pytest.approx(b, abs=1e-5)
    ctx_len = len(live._encode_pair(context, choices[0])[0])
    assert calls.count(torch.Size([1, ctx_len])) == 1  # the shared context ran once
    assert sum(s[1] for s in calls) < sum(s[1] for s in [torch.Size([1, ctx_len + 4])] * len(choices))


def test_generate_until_with_beams_returns_the_best_beam_cut_at_the_stop_sequence(live):
    from glm_dist.models.generate import GenerationConfig, generate

    prompt = live.tok_encode("Return the")
    cfg = GenerationConfig(
        max_new_tokens=8, strategy="beam", num_beams=4, length_penalty=0.6, eos_id=0, early_stopping=False
    )  # transformers' default, which lm-eval's hf model runs with
    best = live.tok_decode(generate(live.model, torch.tensor([prompt]), cfg)[0, len(prompt) :].tolist())
    kwargs = {"until": [], "max_gen_toks": 8, "do_sample": False, "num_beams": 4, "length_penalty": 0.6}
    assert live.generate_until([Req("Return the", kwargs)])[0] == best
    prompts = ["Return the", "def open(file", "The", "Raise an exception", "x ="]
    beams = live.generate_until([Req(p, kwargs) for p in prompts])
    greedy = live.generate_until([Req(p, {**kwargs, "num_beams": 1}) for p in prompts])
    assert beams != greedy  # the search is not greedy decoding
    stop = best.strip()[1:3]  # a stop sequence ends the hypotheses that reach it, as EOS does
    ended = generate(live.model, torch.tensor([prompt]), cfg, stop=lambda ids: stop in live.tok_decode(ids))
    text = live.tok_decode(ended[0, len(prompt) :].tolist())
    cut = live.generate_until([Req("Return the", {**kwargs, "until": [stop]})])[0]
    assert stop in text and cut == text[: text.index(stop)]


def test_per_token_normalisation_divides_each_choice_by_its_own_token_count(live):
    from glm_dist.eval.harness import per_token_hit

    context = "Definition: a building where books are kept\nWord:"
    choices = [" a", " archive of the city", " library", " bookshop and reading room"]
    requests = [(context, c) for c in choices]
    resps = [[r] for r in live.loglikelihood([Req(*r) for r in requests])]
    counts = [len(live._encode_pair(context, c)[1]) for c in choices]
    assert len(set(counts)) > 2  # the choices differ in length, so the normalisations can differ
    means = [r[0][0] / n for r, n in zip(resps, counts)]
    best = max(range(4), key=means.__getitem__)
    for gold in range(4):
        sample = {"arguments": requests, "resps": resps, "target": gold}
        assert per_token_hit(live, sample) == float(gold == best)
        unconditional = [("", c) for c in choices]  # acc_mutual_info's extra requests are left out
        extra = [[r] for r in live.loglikelihood([Req(*r) for r in unconditional])]
        assert per_token_hit(
            live, {"arguments": requests + unconditional, "resps": resps + extra, "target": gold}
        ) == float(gold == best)


def test_rolling_loglikelihood_predicts_every_token_once_in_windows_of_the_context(live):
    text = "Return a new list containing all items from the iterable in ascending order. " * 3
    ids = live.tok_encode(text)
    assert len(ids) > 2 * live.max_length  # several windows
    with torch.no_grad():  # each token predicted from as much context as fits, stride 1
        full = sum(
            _manual_loglikelihood(live, ([0] + ids)[max(0, i - live.max_length + 1) : i + 1], [ids[i]])
            for i in range(len(ids))
        )
    strided = GlmLM(model=live.model, tokenizer=live.tok, eot_id=0, rolling_stride=1)
    assert strided.loglikelihood_rolling([Req(text)])[0] == pytest.approx(full, abs=1e-3)
    disjoint = live.loglikelihood_rolling([Req(text)])[0]  # the default: lm-eval's disjoint windows
    assert disjoint < 0 and disjoint != pytest.approx(full, abs=1e-3)


def test_generate_until_stops_at_a_stop_sequence(live):
    free = live.generate_until([Req("The", {"until": [], "max_gen_toks": 10, "do_sample": False})])[0]
    assert len(live.tok_encode(free)) >= 5
    stop = free.strip()[2:4] or free[1:3]
    cut = live.generate_until([Req("The", {"until": [stop], "max_gen_toks": 10, "do_sample": False})])[0]
    assert stop not in cut and free.startswith(cut)


def test_results_cross_ranks_as_json_with_their_tuple_keys():
    metrics = {
        "task": {("acc", "none"): [1.0, 0.0], ("perplexity", "none"): [(-1.5, True), (-2.0, False)]},
        "other": {("f1", "none"): [torch.tensor(0.25)]},
    }
    back = _from_json(json.loads(json.dumps(_to_json(metrics))))
    assert back == {**metrics, "other": {("f1", "none"): [0.25]}}
    assert type(back["task"][("perplexity", "none")][0]) is tuple


def test_the_cloze_tests_only_documents_held_out_of_pretraining(corpus):
    from data_pipeline.tasks.cloze import build

    task = build(read_documents(corpus), max_train=50)
    test, train = task.splits["test"], task.splits["train"]
    assert len(test) >= 40 and len(train) == 50
    assert all(is_validation(r["id"].rsplit("/p", 1)[0], 50) for r in test)
    assert not any(is_validation(r["id"].rsplit("/p", 1)[0], 50) for r in train)
    for row in test:
        assert row["target"].isalpha() and row["target"].islower() and len(row["context"].split()) >= 12
    assert len({r["id"] for r in test + train}) == len(test) + len(train)
    assert build(read_documents(corpus), max_train=50).splits == task.splits  # stable


def test_wordnet_items_define_their_answer_among_same_part_of_speech_distractors():
    from data_pipeline.tasks.wordnet_mc import build

    task = build(num_test=300, num_train=20)
    rows = task.splits["test"]
    assert len(rows) == 300 and len(task.splits["train"]) == 20
    assert {r["pos"] for r in rows} >= {"n", "v", "a"}
    for r in rows:
        answer = r["choices"][r["label"]]
        assert len(set(r["choices"])) == 4 and answer not in r["definition"].lower()
    know = [r for r in build(num_test=2000).splits["test"] if r["id"] == "wn30:v00595630"]
    assert (
        know
        and know[0]["definition"] == "be aware of the truth of something"
        and know[0]["choices"][know[0]["label"]] == "know"
    )
    assert task.baselines["acc: chance"] == 0.25


def test_wordnet_builder_says_how_to_install_wordnet(tmp_path):
    from data_pipeline.tasks.wordnet_mc import build
    from data_pipeline.wordnet import WordNetMissing

    with pytest.raises(WordNetMissing, match="apt-get install -y wordnet-base"):
        build(str(tmp_path))


@pytest.fixture(scope="module")
def task_dir(corpus, tmp_path_factory) -> Path:
    """The three offline tasks built by `glm data eval-tasks`, plus a rolling-perplexity and a
    generation task over a few pydoc paragraphs."""
    out = tmp_path_factory.mktemp("tasks")
    proc = run_glm(["data", "eval-tasks", "--out", str(out), "--source", corpus])
    assert all(f"{name}: {out / name}" in proc.stdout for name in ("pydoc_cloze", "wordnet_mc", "docstring_mc"))
    for name in ("pydoc_cloze", "wordnet_mc", "docstring_mc"):
        assert (out / name / "README.md").read_text().startswith(f"# {name}")
    test = out / "pydoc_cloze/test.jsonl"
    common = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(test)}}, "test_split": "test"}
    (out / "extra").mkdir()
    (out / "extra/pydoc_rolling.yaml").write_text(
        yaml.safe_dump(
            {
                "task": "pydoc_rolling",
                **common,
                "output_type": "loglikelihood_rolling",
                "doc_to_text": "",
                "doc_to_target": "{{context}} {{target}}. {{context}} {{context}}",
                "metric_list": [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")],
            }
        )
    )
    (out / "extra/pydoc_generate.yaml").write_text(
        yaml.safe_dump(
            {
                "task": "pydoc_generate",
                **common,
                "output_type": "generate_until",
                "doc_to_text": "{{context}}",
                "doc_to_target": "{{' ' + target}}",
                "generation_kwargs": {"until": ["."], "max_gen_toks": 8, "do_sample": False},
                "metric_list": [{"metric": "exact_match"}],
            }
        )
    )
    return out


@pytest.fixture(scope="module")
def gpt2_run(shards_dir, tmp_path_factory) -> tuple[str, str]:
    """A tiny GPT-2 pretrained for 60 steps, and its `glm export-hf` folder."""
    out = tmp_path_factory.mktemp("gpt2")
    run_glm(
        [
            "train",
            "-c",
            TINY,
            *FAST,
            f"data.shards_dir={shards_dir}",
            "data.vocab_size=2048",
            "model.vocab_size=2048",
            "train.max_steps=60",
            f"train.out_dir={out}",
        ]
    )
    from glm_dist.hf.export import export_checkpoint  # what glm export-hf runs

    ckpt = str(out / "checkpoints/step_00000060")
    export_checkpoint(ckpt, out / "hf")
    return ckpt, str(out / "hf")


def _harness(
    model: list[str], task_dir: Path, out: Path, *extra: str, tasks: str = TASKS, limit: int = 12
) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        *model,
        "--tasks",
        tasks,
        "--include_path",
        str(task_dir),
        "--limit",
        str(limit),
        "--batch_size",
        "4",
        "--num_fewshot",
        "1",
        "--output_path",
        str(out),
        "--log_samples",
        *extra,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(threads=2), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _results(out: Path) -> tuple[dict, dict]:
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    samples = {}
    for path in out.rglob("samples_*.jsonl"):
        for row in map(json.loads, path.read_text().splitlines()):
            samples[(row["doc"].get("id"), str(row["arguments"]))] = row["filtered_resps"]
    return results, samples


def _assert_same_scores(ours: dict, theirs: dict, tasks: str = TASKS) -> None:
    assert set(ours) == set(theirs) == set(tasks.split(","))
    for task, metrics in theirs.items():
        for key, value in metrics.items():
            if key.endswith(",none") and "stderr" not in key and isinstance(value, float):
                assert ours[task][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (task, key)


def _assert_same_requests(mine: dict, hers: dict, n: int) -> None:
    """Both harness runs logged the same n requests; a mismatch names the documents whose logged
    arguments differ and shows where they part (the whole sets are too long to read in a log)."""
    only_mine, only_hers = sorted(set(mine) - set(hers)), sorted(set(hers) - set(mine))

    def parting(key, others) -> str:
        twin = next((o for o in others if o[0] == key[0]), None)
        if twin is None:
            return f"{key[0]}: no request of this document on the other side"
        at = next((i for i, (a, b) in enumerate(zip(key[1], twin[1])) if a != b), min(len(key[1]), len(twin[1])))
        return f"{key[0]} at char {at}: {key[1][max(0, at - 60) : at + 60]!r} vs {twin[1][max(0, at - 60) : at + 60]!r}"

    assert not only_mine and not only_hers, "\n".join(
        [f"{len(only_mine)} requests only in ours, {len(only_hers)} only in lm-eval's:"]
        + [parting(k, only_hers) for k in only_mine[:4]]
        + [parting(k, only_mine) for k in only_hers[:4]]
    )
    assert len(mine) == n, (len(mine), n)


def _assert_same_responses(mine, hers, where) -> None:
    """Logged responses (numbers written as strings): log-likelihoods within 1e-4 (a long document's
    sum over ~1000 tokens within 1e-6 of its value: fp32 summation order), the rest equal."""
    if isinstance(hers, list):
        assert isinstance(mine, list) and len(mine) == len(hers), where
        for a, b in zip(mine, hers):
            _assert_same_responses(a, b, where)
        return
    try:
        assert float(mine) == pytest.approx(float(hers), abs=1e-4, rel=1e-6), where
    except ValueError:
        assert mine == hers, where


# The offline tasks and the GPT-2 / GPT-3 style ones scored in one harness run each side (a run's
# start, lm-eval's imports, takes most of its ~13 s). Greedy generation: the summary's top-k sampling
# draws differ (pydoc_generate's own kwargs are these already).
EVERY = f"{TASKS},{NEW}"
GREEDY = ["--gen_kwargs", "do_sample=False,max_gen_toks=8"]


@pytest.fixture(scope="module")
def glm_scores(gpt2_run, task_dir, tmp_path_factory) -> tuple[dict, dict]:
    out = tmp_path_factory.mktemp("glm-scores")
    model = ["glm_dist.eval.harness", "--model", "glm", "--model_args", f"checkpoint={gpt2_run[0]}"]
    _harness(model, task_dir, out, *GREEDY, tasks=EVERY)
    return _results(out)


@pytest.mark.slow
def test_the_glm_harness_scores_equal_lm_eval_hf_on_the_exported_model(gpt2_run, task_dir, glm_scores, tmp_path):
    """Every task, the new ones with unconditional choices (acc_mutual_info), ROUGE, BLEU and F1 included."""
    _harness(
        ["lm_eval", "--model", "hf", "--model_args", f"pretrained={gpt2_run[1]},dtype=float32"],
        task_dir,
        tmp_path,
        "--device",
        "cpu",
        *GREEDY,
        tasks=EVERY,
    )
    (ours, our_samples), (theirs, their_samples) = glm_scores, _results(tmp_path)
    _assert_same_scores(ours, theirs, EVERY)
    _assert_same_requests(our_samples, their_samples, 12 * 8 + 9)  # a row per document (doc_summary has 9)
    for key, resps in their_samples.items():  # every request's log-likelihood, greedy flag and generation
        _assert_same_responses(our_samples[key], resps, key)
    assert {"rouge1,none", "bleu,none", "f1,none", "acc_mutual_info,none"} <= {k for m in ours.values() for k in m}


def test_eval_tasks_writes_variants_and_scoring_beside_their_task(task_dir):
    from lm_eval.tasks._yaml_loader import load_yaml  # how lm-eval reads a task YAML (includes, !function)

    beam = load_yaml(task_dir / "wordnet_qa/wordnet_qa_beam.yaml")
    assert beam["task"] == "wordnet_qa_beam" and beam["generation_kwargs"]["num_beams"] == 4
    assert beam["generation_kwargs"]["length_penalty"] == 0.6 and "Q: {{question}}" in beam["doc_to_text"]
    unconditional = load_yaml(task_dir / "wordnet_mc/wordnet_mc_unconditional.yaml")
    assert "acc_mutual_info" in [m["metric"] for m in unconditional["metric_list"]]
    for folder, name in (("doc_summary", "summary_rouge"), ("wordnet_qa", "answer_f1_em")):
        score = load_yaml(task_dir / folder / f"{folder}.yaml")["process_results"]  # scoring.py beside the YAML
        assert callable(score) and score.__name__ == name
    baselines = json.loads((task_dir / "translation_de/baselines.json").read_text())
    assert baselines["sizes"]["test"] == 500


@pytest.mark.slow
def test_an_encoder_decoder_scores_equal_to_lm_eval_hf_seq2seq_on_its_export(corpus, task_dir, tmp_path):
    """A random tiny T5 with a T5 tokenizer trained on the corpus, scored in one process by GlmLM and
    by lm-eval's hf model (``backend=seq2seq``) on its transformers export."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from data_pipeline.tokenize.profiles import special_ids, train_tokenizer
    from glm_dist.models.generate import GenerationConfig, generate
    from glm_dist.families.t5.hf import export_hf
    from glm_dist.families.t5.model import T5, t5_config

    tok = train_tokenizer("t5", [d["text"] for d in read_documents(corpus)][:200], vocab_size=800)
    tok.save(str(tmp_path / "tokenizer.json"))
    torch.manual_seed(0)
    model = T5(t5_config("t5-tiny", vocab_size=tok.get_vocab_size(), n_layer=1)).eval()
    export_hf(
        model.cfg,
        model.state_dict(),
        str(tmp_path / "hf"),
        tokenizer_file=str(tmp_path / "tokenizer.json"),
        profile="t5",
    )
    ids = special_ids(tok, "t5")
    ours = GlmLM(model=model, tokenizer=tok, eot_id=ids["eos"], start_id=ids["pad"], batch_size=4)
    theirs = HFLM(pretrained=str(tmp_path / "hf"), backend="seq2seq", dtype="float32", device="cpu", batch_size=4)
    tasks = ["pydoc_cloze", "wordnet_mc_unconditional", "pydoc_rolling"]  # pairs, empty contexts, windows
    manager = TaskManager(include_path=str(task_dir), include_defaults=False)
    runs = [
        simple_evaluate(model=lm, tasks=tasks, limit=8, task_manager=manager, log_samples=True) for lm in (ours, theirs)
    ]
    _assert_same_scores(*[r["results"] for r in runs], ",".join(tasks))
    for mine, hers in zip(*[[s for t in tasks for s in r["samples"][t]] for r in runs]):
        assert mine["doc_id"] == hers["doc_id"]
        _assert_same_responses(
            json.loads(json.dumps(mine["resps"])), json.loads(json.dumps(hers["resps"])), mine["doc_id"]
        )
    prompt = ours.tok_encode("Return the number of")  # generation: the encoder reads it, the decoder starts
    seq = generate(
        model, torch.tensor([prompt]), GenerationConfig(max_new_tokens=6, eos_id=ours.eot), start_id=ours.start_id
    )[0, 1:].tolist()
    expected = ours.tok_decode(seq[: seq.index(ours.eot)] if ours.eot in seq else seq)
    assert ours.generate_until([Req("Return the number of", {"until": [], "max_gen_toks": 6})])[0] == expected


@pytest.mark.slow
def test_glm_eval_curve_writes_score_against_k_as_json_and_png(gpt2_run, task_dir, tmp_path):
    from glm_dist.eval.harness import run_tasks

    out = tmp_path / "curve.json"
    proc = run_glm(
        [
            "eval",
            "--checkpoint",
            gpt2_run[0],
            "--tasks",
            "wordnet_mc,pydoc_cloze",
            "--include-path",
            str(task_dir),
            "--limit",
            "8",
            "--batch-size",
            "4",
            "--curve",
            "k=0,1",
            "--out",
            str(out),
        ]
    )
    assert f"curve: {out}" in proc.stdout
    curve = json.loads(out.read_text())
    assert curve["ks"] == [0, 1] and curve["checkpoints"][0]["params"] > 100_000
    points = {(p["k"], p["task"], p["metric"]): p["value"] for p in curve["points"]}
    assert {(k, "wordnet_mc", m) for k in (0, 1) for m in ("acc", "acc_norm", "acc_per_token")} <= set(points)
    one = run_tasks(gpt2_run[0], ["wordnet_mc"], include_path=str(task_dir), num_fewshot=1, limit=8, batch_size=4)
    for metric in ("acc", "acc_norm", "acc_per_token"):
        assert points[(1, "wordnet_mc", metric)] == pytest.approx(one["results"]["wordnet_mc"][f"{metric},none"])
    assert [Path(p).name for p in curve["plots"]] == ["curve_k.png"]
    assert (tmp_path / "curve_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_glm_eval_splits_the_requests_over_data_parallel_ranks_and_writes_lm_evals_json(gpt2_run, task_dir, tmp_path):
    from glm_dist.eval.harness import run_tasks

    tasks = "pydoc_cloze,wordnet_mc,pydoc_rolling"  # zero-shot: lm-eval draws few-shot examples from one RNG
    proc = run_glm(
        [
            "eval",
            "--checkpoint",
            gpt2_run[0],
            "--tasks",
            tasks,
            "--include-path",
            str(task_dir),  # per task,
            "--limit",
            "12",
            "--batch-size",
            "4",
            "--num-fewshot",
            "0",
            "--out",
            str(tmp_path / "r.json"),
        ],
        nproc=2,
    )  # advanced document by document, so k > 0 prompts depend on the split
    assert proc.stdout.count("|pydoc_cloze") == 1 and "perplexity" in proc.stdout  # lm-eval's table, on rank 0
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["n-shot"]["wordnet_mc"] == 0 and written["config"]["limit"] == 12
    one = run_tasks(gpt2_run[0], tasks.split(","), include_path=str(task_dir), num_fewshot=0, limit=12, batch_size=4)
    _assert_same_scores(written["results"], one["results"], tasks)


@pytest.mark.slow
def test_glm_generate_streams_the_greedy_continuation(gpt2_run):
    import io

    from glm_dist.models.generate import GenerationConfig, generate
    from glm_dist.eval.stream import generate_to, load_decoder

    proc = run_glm(["generate", "--checkpoint", gpt2_run[0], "--prompt", "Return the", "--max-new-tokens", "12"])
    lm = load_decoder(gpt2_run[0])
    prompt = lm.tokenizer.encode("Return the").ids
    seq = generate(lm.model, torch.tensor([prompt]), GenerationConfig(max_new_tokens=12, eos_id=lm.eos_id))[0]
    new = [t for t in seq[len(prompt) :].tolist() if t != lm.eos_id]
    expected = lm.tokenizer.decode(new)
    # only the text on stdout; what the tiny 60-step model says is not a bar (once only spaces and a "|")
    assert proc.stdout == expected + "\n" and len(new) >= 2 and expected.strip()

    class Pieces(io.StringIO):
        writes: list[str] = []

        def write(self, s):
            self.writes.append(s)
            return super().write(s)

    out = Pieces()
    assert generate_to(out, gpt2_run[0], "Return the", max_new_tokens=12) == expected
    assert len([w for w in out.writes if w]) >= 5  # streamed: a piece per token, not one write at the end
    beam = generate_to(io.StringIO(), gpt2_run[0], "Return the", strategy="beam", max_new_tokens=6, num_beams=3)
    samples = {
        generate_to(io.StringIO(), gpt2_run[0], "Return the", strategy="sample", max_new_tokens=6, top_k=50, seed=s)
        for s in range(4)
    }
    assert beam.strip() and len(samples) > 1  # seeds change the samples


def test_glm_eval_without_tasks_or_a_config_says_what_it_needs(tmp_path):
    proc = run_glm(["eval", "--checkpoint", str(tmp_path)], check=False)
    assert proc.returncode == 2 and "-c CONFIG" in proc.stderr and "--tasks" in proc.stderr
