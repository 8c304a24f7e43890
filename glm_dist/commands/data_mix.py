"""``glm data mix``: a config's ``data.mixture`` as GPT-3's Table 2.2 before it trains -- per source the
tokens it holds, its weight, the tokens the run draws and the epochs that makes (``glm_dist/data/mix_report.py``)."""

from __future__ import annotations

from glm_dist.data.mix_report import add_arguments, run

HELP = "a config's data mixture per source: tokens, weight, tokens the run draws, epochs (GPT-3's Table 2.2)"

__all__ = ["HELP", "add_arguments", "run"]
