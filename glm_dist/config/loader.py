"""Training configs: YAML files with ``base:`` inheritance, ``key=value`` overrides and the strict
schema of ``config/schema.py``. The YAML rules themselves live in ``glm_common.config_yaml`` (the data
pipeline's recipes use them too); their names are re-exported here for the users of this module."""

from __future__ import annotations

from pathlib import Path

from glm_common.config_bounds import check_bounds
from glm_common.config_yaml import CLI, MAX_CONFIG_BYTES, ConfigError, load_structured, source_of, to_dict
from glm_dist.config.mixture import check_mixture
from glm_dist.config.schema import Config
from glm_dist.ops.hardware import native_bf16

__all__ = ["CLI", "MAX_CONFIG_BYTES", "ConfigError", "load_config", "load_structured", "source_of", "to_dict"]


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Resolve ``path`` (and its ``base:`` chain), apply ``key=value`` overrides, build the schema and
    check every number's range (``glm_common/config_bounds.py``) and ``data.mixture``'s entries;
    ``train.precision=auto`` becomes fp32 or bf16 by what this machine's device computes natively."""
    cfg = load_structured(Config, path, overrides)
    check_bounds(cfg)
    check_mixture(cfg)
    if cfg.train.precision == "auto":
        cfg.train.precision = "bf16" if native_bf16()[0] else "fp32"
    return cfg
