"""Every transformers adapter is one ``HFAdapter``, and imports what it exports.

The encoder and seq2seq families import a tiny randomly initialised transformers model (the parity
tests' configs and inputs), build our model from the result and give transformers' logits; exporting
that and importing it again gives the same config and identical tensors.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from glm_dist.families.registry import FAMILIES
from glm_dist.families.spec import HFAdapter
from tests.test_hf_parity_encoders import CASES as ENCODERS
from tests.test_hf_parity_encoders import TOL, compare
from tests.test_seq2seq import _inputs as seq2seq_inputs


def _parameters(fn) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]


@pytest.mark.parametrize("module", sorted({spec.hf for spec in FAMILIES.values() if spec.hf}))
def test_every_adapter_module_is_an_hf_adapter(module):
    """Same positional parameters and keyword options as the protocol; anything more is a keyword
    option with a default (GPT's pad_vocab_to_multiple_of)."""
    adapter = importlib.import_module(module)
    for name in ("export_hf", "import_hf"):
        want, have = _parameters(getattr(HFAdapter, name)), _parameters(getattr(adapter, name))
        positional = [(p.name, p.kind) for p in have if p.kind is not p.KEYWORD_ONLY]
        assert positional == [(p.name, p.kind) for p in want if p.kind is not p.KEYWORD_ONLY], (module, name)
        options = {p.name: p for p in have if p.kind is p.KEYWORD_ONLY}
        for p in want:
            if p.kind is p.KEYWORD_ONLY:
                assert p.name in options and options[p.name].default == p.default, (module, name, p.name)
        extra = set(options) - {p.name for p in want}
        assert all(options[o].default is not inspect.Parameter.empty for o in extra), (module, name, extra)


def _seq2seq(family: str, flavor: str):
    """(adapter, our model class, config, transformers class, logits of (ours, theirs)) for T5 / BART."""
    from transformers import BartForConditionalGeneration, T5ForConditionalGeneration

    from glm_dist.families.bart import hf as bart_hf
    from glm_dist.families.bart.model import Bart, bart_config
    from glm_dist.families.t5 import hf as t5_hf
    from glm_dist.families.t5.model import T5, t5_config

    if family == "t5":
        cfg, adapter, ours, theirs, start = t5_config(flavor, vocab_size=700), t5_hf, T5, T5ForConditionalGeneration, 0
    else:
        cfg, adapter, ours, theirs, start = (
            bart_config(flavor, vocab_size=700),
            bart_hf,
            Bart,
            BartForConditionalGeneration,
            2,
        )

    def diff(model, hf, cfg):
        x, mask, dec = seq2seq_inputs(cfg.pad_id, start if family == "bart" else cfg.pad_id, 700)
        with torch.no_grad():
            return (
                (
                    model(x, dec, attention_mask=mask)["logits"]
                    - hf(input_ids=x, attention_mask=mask, decoder_input_ids=dec).logits
                )
                .abs()
                .max()
                .item()
            )

    return adapter, ours, cfg, theirs, diff


def _encoder(case: str):
    from glm_dist.families.bert import hf as bert_hf
    from glm_dist.families.bert.model import Encoder

    cfg = ENCODERS[case]()
    return bert_hf, Encoder, cfg, bert_hf.hf_model_class(cfg), compare


CASES = {
    **{case: (lambda case=case: _encoder(case)) for case in ENCODERS},
    "t5": lambda: _seq2seq("t5", "t5-tiny"),
    "t5-v1_1": lambda: _seq2seq("t5", "t5-v1_1-tiny"),
    "bart": lambda: _seq2seq("bart", "bart-tiny"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_import_matches_transformers_and_round_trips_through_export(case, tmp_path):
    adapter, ours_class, cfg, hf_class, diff = CASES[case]()
    torch.manual_seed(0)
    hf = hf_class(adapter.to_hf_config(cfg)).eval()
    imported, sd = adapter.import_hf(hf)
    ours = ours_class(imported).eval()
    ours.load_state_dict(sd)
    assert diff(ours, hf, imported) <= TOL
    if case == "t5-v1_1":  # untied: transformers 5 ties T5's output layer, so export refuses it
        with pytest.raises(ValueError, match="untied"):
            adapter.export_hf(imported, sd, str(tmp_path))
        return
    adapter.export_hf(imported, sd, str(tmp_path))
    again, sd_again = adapter.import_hf(hf_class.from_pretrained(str(tmp_path)))
    assert again == imported
    assert sd_again.keys() == sd.keys()
    assert all(torch.equal(sd_again[k], sd[k]) for k in sd), [k for k in sd if not torch.equal(sd_again[k], sd[k])]
