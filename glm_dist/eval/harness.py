"""lm-evaluation-harness as the scoring engine: an ``LM`` registered as ``glm``.

``GlmLM`` scores a glm checkpoint (its consolidated weights, ``load_checkpoint_model``) or a live
model with its ``tokenizers`` tokenizer, the way lm-eval's ``hf`` model scores a transformers causal
LM (GPT) or sequence-to-sequence model (T5, BART: ``backend=seq2seq``), so the two agree on the same
weights. Decoder-only:

- ``loglikelihood``: context + continuation in one forward pass, requests batched and sorted by
  length (longest first, lm-eval's ``Collator``), over-long inputs cut from the left; requests that
  share a context (multiple choice: one context, a continuation per choice) run the context once into
  a key/value cache and each continuation from it (``prefix_cache=false`` turns that off);
- ``loglikelihood_rolling``: a document in windows of the context length, each predicting
  ``rolling_stride`` new tokens (default: the whole window, lm-eval's disjoint windows) after the
  tokens before them;
- ``generate_until``: greedy, sampled (``do_sample``, ``temperature``, ``top_k``, ``top_p``) or beam
  search (``num_beams`` > 1, ``length_penalty``; ``models/generate.py``) decoding with the model's
  key/value cache, stopped at any of the stop sequences, EOS or ``max_gen_toks`` (in beam search a
  stop sequence ends a hypothesis, as lm-eval's hf stopping criteria do in transformers' search).

Encoder-decoders: the context (with the tokenizer's special tokens) is the encoder's input, read
once per distinct context, and the continuation is scored by the decoder from its start token;
``generate_until`` decodes from the start token (``max_gen_toks`` new tokens; lm-eval's hf model
instead lets the decoder run to the padded context length + ``max_gen_toks``).

Under torchrun each rank scores its share of every task (lm-eval splits the documents by ``rank``
and ``world_size``); metrics come back to rank 0 as JSON through ``glm_dist.parallel.comm``.

``python -m glm_dist.eval.harness --model glm --model_args checkpoint=DIR --tasks ...`` is lm-eval's
own command line with ``glm`` registered; ``glm eval --checkpoint DIR --tasks ...`` runs the same.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry, register_model
from lm_eval.models.utils import Collator, handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tokenizers import Tokenizer

from glm_dist.errors import GlmError
from glm_dist.eval.stream import TextStream, load_decoder, stream_tokens
from glm_dist.models.generate import GenerationConfig, generate
from glm_dist.parallel import comm
from glm_dist.parallel.distributed import init_distributed

Request = tuple[tuple[str, str], list[int], list[int]]  # (strings, context tokens, continuation tokens)


class HarnessError(GlmError, ValueError):
    """A model, task or option the harness cannot use."""


def _int(value, default: int) -> int:
    """lm-eval hands options over as strings (``"8"``, ``"auto"``)."""
    return int(value) if str(value).isdigit() else default


class GlmLM(TemplateLM):
    backend = "causal"

    def __init__(
        self,
        checkpoint: str | None = None,
        *,
        model: torch.nn.Module | None = None,
        tokenizer: Tokenizer | None = None,
        eot_id: int | None = None,
        start_id: int | None = None,
        batch_size: int | str = 8,
        max_gen_toks: int | str = 256,
        rolling_stride: int | str | None = None,
        device: str | None = None,
        prefix_cache: bool | str = True,
        **_ignored,
    ):
        super().__init__()
        if checkpoint is not None:
            loaded = load_decoder(checkpoint)
            model, tokenizer, eot_id, start_id = loaded.model, loaded.tokenizer, loaded.eos_id, loaded.start_id
        if model is None or tokenizer is None or eot_id is None:
            raise HarnessError("the glm model needs checkpoint=DIR, or a live model with its tokenizer and eot_id")
        self.seq2seq = hasattr(model, "encode")
        self.backend = "seq2seq" if self.seq2seq else "causal"  # lm-eval's _encode_pair reads it
        if self.seq2seq and start_id is None:
            raise HarnessError("an encoder-decoder needs start_id, the decoder's first token")
        self.start_id = start_id
        self._rank, self._world_size = _join_ranks()
        self._device = _device(device)
        self.model, self.tok, self.eot = model.to(self._device).eval(), tokenizer, int(eot_id)
        self.batch_size = _int(batch_size, 8)
        self.max_gen_toks = _int(max_gen_toks, 256)
        self.prefix_cache = str(prefix_cache).lower() not in ("false", "0", "no")
        self.stride = _int(rolling_stride, self.max_length) if rolling_stride is not None else self.max_length
        if not 1 <= self.stride <= self.max_length:
            raise HarnessError(
                f"rolling_stride={self.stride} must be between 1 and the context length {self.max_length}"
            )

    @property
    def eot_token_id(self) -> int:
        return self.eot

    @property
    def prefix_token_id(self) -> int:
        """What an empty context becomes: end of text (GPT); an encoder-decoder's tokenizer's
        first special token where it puts one before the text (BART's <s>), as lm-eval's hf
        model uses the beginning-of-sequence token when there is one."""
        if self.seq2seq:
            specials = self.tok.encode("", add_special_tokens=True).ids
            return specials[0] if len(specials) > 1 else self.eot
        return self.eot

    @property
    def max_length(self) -> int:
        return self.model.cfg.context_length

    @property
    def tokenizer_name(self) -> str:
        return "glm"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """Decoder-only: the text's tokens; encoder-decoder: with the tokenizer's special tokens
        (T5's ``</s>``, BART's ``<s> ... </s>``) unless told otherwise, as lm-eval's hf model does."""
        special = self.seq2seq if add_special_tokens is None else add_special_tokens
        return self.tok.encode(string, add_special_tokens=bool(special)).ids

    def tok_decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    @torch.no_grad()
    def _loglikelihood_tokens(
        self, requests: list[Request], disable_tqdm: bool = False, **kwargs
    ) -> list[tuple[float, bool]]:
        """Sum of log-probabilities of each continuation, and whether greedy decoding gives it.
        Requests that share their context (multiple choice) run it once (``_shared_context``)."""
        if self.seq2seq:
            out = self._encoder_decoder(requests)
            for (strings, _, _), answer in zip(requests, out):
                if strings is not None:
                    self.cache_hook.add_partial("loglikelihood", strings, answer)
            return out
        out: list[tuple[float, bool] | None] = [None] * len(requests)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (_, ctx, cont) in enumerate(requests):
            if self.prefix_cache and len(ctx) + len(cont) <= self.max_length + 1:  # nothing cut from the left
                groups.setdefault(tuple(ctx), []).append(i)
        shared = [g for g in groups.values() if len(g) > 1]
        for group in shared:
            for i, answer in zip(group, self._shared_context([requests[i] for i in group])):
                out[i] = answer
        rest = [i for i in range(len(requests)) if out[i] is None]
        for i, answer in zip(rest, self._one_pass([requests[i] for i in rest])):
            out[i] = answer
        for (strings, _, _), answer in zip(requests, out):
            if strings is not None:
                self.cache_hook.add_partial("loglikelihood", strings, answer)
        return out

    def _one_pass(self, requests: list[Request]) -> list[tuple[float, bool]]:
        """Context + continuation in one forward, batched longest first (lm-eval's ``Collator``)."""
        order = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])))
        out = []
        for chunk in order.get_batched(n=self.batch_size):
            inputs = [(ctx + cont)[-(self.max_length + 1) :][:-1] for _, ctx, cont in chunk]  # cut from the left
            batch = torch.zeros(len(inputs), max(map(len, inputs)), dtype=torch.long)
            for i, ids in enumerate(inputs):
                batch[i, : len(ids)] = torch.tensor(ids)  # right padding: causal, so nothing real sees it
            logprobs = F.log_softmax(self.model(batch.to(self._device)).float(), dim=-1)  # (B, T, V)
            for (_, _, cont), ids, lp in zip(chunk, inputs, logprobs):
                out.append(_score(lp[len(ids) - len(cont) : len(ids)], cont))  # the positions predicting cont
        return order.get_original(out)

    def _shared_context(self, requests: list[Request]) -> list[tuple[float, bool]]:
        """One context, several continuations: the context runs once into a key/value cache, whose
        last position predicts every continuation's first token; the continuations then run from
        copies of that cache, ``batch_size`` at a time."""
        ctx = requests[0][1]
        cache: list[dict] = [{} for _ in self.model.blocks]
        first = F.log_softmax(self.model(torch.tensor([ctx], device=self._device), cache)[0, -1:].float(), -1)
        out = []
        for start in range(0, len(requests), self.batch_size):
            conts = [cont for _, _, cont in requests[start : start + self.batch_size]]
            width = max(len(c) for c in conts) - 1
            rows = [first.expand(len(c), -1) if width == 0 else None for c in conts]
            if width > 0:
                batch = torch.zeros(len(conts), width, dtype=torch.long)
                for i, cont in enumerate(conts):
                    batch[i, : len(cont) - 1] = torch.tensor(cont[:-1])  # right padding, after the real tokens
                copies = [{k: v.expand(len(conts), *v.shape[1:]) for k, v in c.items()} for c in cache]
                later = F.log_softmax(self.model(batch.to(self._device), copies).float(), dim=-1)  # (B, width, V)
                rows = [torch.cat([first, lp[: len(cont) - 1]]) for cont, lp in zip(conts, later)]
            out.extend(_score(r[: len(cont)], cont) for r, cont in zip(rows, conts))
        return out

    def _encoder_decoder(self, requests: list[Request]) -> list[tuple[float, bool]]:
        """Encoder-decoder: the context (its last ``max_length`` tokens) is the encoder's input,
        read once per distinct context; the decoder reads the start token and the continuation
        and predicts the continuation, ``batch_size`` continuations at a time."""
        out: list[tuple[float, bool] | None] = [None] * len(requests)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (_, ctx, _) in enumerate(requests):
            groups.setdefault(tuple(ctx[-self.max_length :]), []).append(i)
        for ctx, members in groups.items():
            memory = self.model.encode(torch.tensor([ctx], device=self._device))  # (1, T_enc, C)
            for start in range(0, len(members), self.batch_size):
                chunk = members[start : start + self.batch_size]
                conts = [requests[i][2][-self.max_length :] for i in chunk]
                batch = torch.full((len(conts), max(map(len, conts))), self.start_id, dtype=torch.long)
                for row, cont in enumerate(conts):
                    batch[row, 1 : len(cont)] = torch.tensor(cont[:-1])  # right padding: the decoder is causal
                logits = self.model.decode(batch.to(self._device), memory.expand(len(conts), -1, -1))
                logprobs = F.log_softmax(logits.float(), dim=-1)  # (B, T_dec, V)
                for i, cont, lp in zip(chunk, conts, logprobs):
                    out[i] = _score(lp[: len(cont)], cont)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each document's total log-likelihood, from the end-of-text token on, in sliding windows."""
        results = []
        for (text,) in [req.args for req in requests]:
            windows = map(
                lm_utils.make_disjoint_window,
                lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=self.max_length - self.stride + 1,
                ),
            )
            total = sum(ll for ll, _ in self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows]))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            results.append(total)
        return results

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        eos = self.tok_decode([self.eot])
        results = []
        for context, gen_kwargs in [req.args for req in requests]:
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            results.append(self._generate(context, until, kwargs))
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), results[-1])
        return results

    def _generate(self, context: str, until: list[str], kwargs: dict) -> str:
        budget = kwargs["max_gen_toks"]
        if budget >= self.max_length and not self.seq2seq:
            raise HarnessError(f"max_gen_toks={budget} must be below the context length {self.max_length}")
        prompt = self.tok_encode(context)[-(self.max_length - (0 if self.seq2seq else budget)) :]
        beams = int(kwargs.get("num_beams") or 1)
        strategy = "beam" if beams > 1 else "sample" if kwargs.get("do_sample") else "greedy"
        cfg = GenerationConfig(
            max_new_tokens=budget,
            strategy=strategy,
            num_beams=beams,
            length_penalty=float(kwargs.get("length_penalty", 1.0)),
            early_stopping=bool(kwargs.get("early_stopping", False)),  # transformers' default
            temperature=float(kwargs.get("temperature") or 1.0),
            top_k=int(kwargs.get("top_k") or 0),
            top_p=float(kwargs.get("top_p") or 1.0),
            eos_id=self.eot,
        )
        text = TextStream(self.tok_decode)
        if strategy == "beam":  # a stop sequence ends a hypothesis as EOS does (lm-eval's hf stopping criteria)

            def stop(ids: list[int]) -> bool:
                return any(s and s in self.tok_decode(ids) for s in until)

            seq = generate(
                self.model, torch.tensor([prompt], device=self._device), cfg, start_id=self.start_id, stop=stop
            )[0]
            seq = seq[1 if self.seq2seq else len(prompt) :].tolist()  # the decoder's start token, or the prompt
            text.ids = seq[: seq.index(self.eot) + 1] if self.eot in seq else seq
            return postprocess_generated_text(text.text, until, None)
        for token in stream_tokens(self.model, prompt, cfg, start_id=self.start_id):
            text.push(token)
            if any(stop and stop in text.text for stop in until):
                break
        return postprocess_generated_text(text.text, until, None)

    # -- data parallelism: lm-eval splits documents by rank; results travel as JSON, never pickled --
    # (the comm helpers return at once in a world of one, unless GLM_FORCE_COLLECTIVES=1 runs them)
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.stack(comm.all_gather(tensor)) if self.world_size > 1 or comm.forced() else tensor

    def gather_object(self, obj, dst: int = 0):
        parts = comm.all_gather_bytes(json.dumps(_to_json(obj)).encode())
        if self.rank != dst:
            return None
        return [_from_json(json.loads(p.decode())) for p in parts]

    def barrier(self) -> None:
        comm.barrier()


if "glm" not in model_registry:  # ``python -m`` runs this file as __main__ and may import it again
    register_model("glm")(GlmLM)


def _score(rows: torch.Tensor, cont: list[int]) -> tuple[float, bool]:
    """(sum of the log-probabilities of ``cont`` under ``rows`` (len(cont), V), greedy or not)."""
    target = torch.tensor(cont, device=rows.device)
    return rows.gather(-1, target[:, None]).sum().item(), bool((rows.argmax(-1) == target).all())


def _device(asked: str | None) -> torch.device:
    """lm-eval's ``--device`` (its default is ``cuda``): the GPU when there is one, else the CPU."""
    if torch.cuda.is_available() and (asked is None or asked.startswith("cuda")):
        return torch.device("cuda", torch.cuda.current_device()) if asked in (None, "cuda") else torch.device(asked)
    return torch.device("cpu" if asked is None or asked.startswith("cuda") else asked)


def _join_ranks() -> tuple[int, int]:
    """(rank, world size): a world of one, or torchrun's ranks joined in one process group."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    info = init_distributed()
    return info.rank, info.world_size


def _to_json(obj):
    """Metric values keyed by (metric, filter) tuples -> plain JSON (tuples and keys tagged)."""
    if isinstance(obj, dict):
        return {"__items__": [[_to_json(k), _to_json(v)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"__tuple__" if isinstance(obj, tuple) else "__list__": [_to_json(v) for v in obj]}
    return _to_json(obj.tolist()) if hasattr(obj, "tolist") else obj  # numpy / torch values


def _from_json(obj):
    if isinstance(obj, dict) and "__items__" in obj:
        return {_from_json(k): _from_json(v) for k, v in obj["__items__"]}
    if isinstance(obj, dict) and "__tuple__" in obj:
        return tuple(_from_json(v) for v in obj["__tuple__"])
    if isinstance(obj, dict) and "__list__" in obj:
        return [_from_json(v) for v in obj["__list__"]]
    return obj


def task_manager(tasks: list[str], include_path: str | None = None):
    """lm-eval's tasks: only ``include_path``'s when it has them all (lm-eval's own are ~15k YAMLs)."""
    from lm_eval.tasks import TaskManager

    if include_path and not Path(include_path).is_dir():
        raise HarnessError(f"--include-path {include_path} is not a folder (build one: glm data eval-tasks --out DIR)")
    manager = TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    if manager is None or not all(manager.match_tasks([t]) for t in tasks):
        manager = TaskManager(include_path=include_path)
    unknown = [t for t in tasks if not manager.match_tasks([t])]
    if unknown:
        raise HarnessError(
            f"unknown task {unknown[0]!r}: build the offline tasks with glm data eval-tasks --out DIR "
            "and pass --include-path DIR, or name one of lm-eval's tasks"
        )
    return manager


def evaluate(
    lm: GlmLM, tasks: list[str], manager, *, num_fewshot: int | None = None, limit: float | None = None
) -> dict | None:
    """lm-eval's ``simple_evaluate`` plus ``acc_per_token`` for multiple-choice tasks; None off rank 0."""
    from lm_eval import simple_evaluate

    results = simple_evaluate(
        model=lm, tasks=tasks, num_fewshot=num_fewshot, limit=limit, task_manager=manager, log_samples=True
    )
    if results is None:
        return None
    for task, samples in results.pop("samples").items():
        if results["configs"][task].get("output_type") == "multiple_choice":
            hits = [per_token_hit(lm, s) for s in samples]
            mean = sum(hits) / len(hits)
            results["results"][task]["acc_per_token,none"] = mean
            results["results"][task]["acc_per_token_stderr,none"] = (
                (mean * (1 - mean) / (len(hits) - 1)) ** 0.5 if len(hits) > 1 else "N/A"
            )
    return results


def per_token_hit(lm: GlmLM, sample: dict) -> float:
    """GPT-3's per-token normalisation of one multiple-choice document: is the choice with the
    highest mean log-likelihood per token (the model's own tokens) the gold one?"""
    args, resps = sample["arguments"], sample["resps"]
    n = len(args)
    if n % 2 == 0 and all(ctx == "" for ctx, _ in args[n // 2 :]) and any(ctx for ctx, _ in args[: n // 2]):
        n //= 2  # acc_mutual_info's unconditional requests follow the choices
    means = []
    for (ctx, cont), resp in zip(args[:n], resps[:n]):
        tokens = lm._encode_pair(ctx, cont)[1] if ctx else lm.tok_encode(cont)
        means.append(resp[0][0] / max(1, len(tokens)))
    best = max(range(n), key=means.__getitem__)
    gold = sample["target"]
    return float(best in gold if isinstance(gold, list) else best == gold)


def run_tasks(
    checkpoint: str,
    tasks: list[str],
    *,
    include_path: str | None = None,
    num_fewshot: int | None = None,
    limit: float | None = None,
    batch_size: int = 8,
    out: str | None = None,
) -> dict | None:
    """``glm eval --tasks``: lm-eval on a checkpoint (``evaluate``); prints lm-eval's table and
    writes its results JSON to ``out`` (rank 0; the other ranks return None)."""
    from lm_eval.utils import handle_non_serializable, make_table

    manager = task_manager(tasks, include_path)
    results = evaluate(GlmLM(checkpoint, batch_size=batch_size), tasks, manager, num_fewshot=num_fewshot, limit=limit)
    if results is None:
        return None
    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(results, indent=2, default=handle_non_serializable))
        print(f"results: {out}")
    return results


def main(argv: list[str] | None = None) -> int:
    """lm-eval's command line (``lm_eval ...``) with ``glm`` among its models."""
    from lm_eval.__main__ import cli_evaluate

    from glm_dist.checkpoint.files import force_weights_only

    force_weights_only()  # no torch.load of this process runs pickled code
    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
