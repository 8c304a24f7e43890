"""Language identification with py3langid: the langid.py model (97 languages) ships inside the
package, so nothing is downloaded at run time; scores are normalised probabilities."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def identify(text: str, max_chars: int = 10_000) -> tuple[str, float]:
    lang, score = _identifier().classify(text[:max_chars])
    return str(lang), float(score)
