"""``glm export-hf``: a checkpoint -> a transformers folder, through the family's adapter."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

from glm_dist.checkpoint.consolidate import checkpoint_tokenizer
from glm_dist.checkpoint.errors import checkpoint_storage
from glm_dist.checkpoint.files import MAX_TOKENIZER_BYTES
from glm_dist.errors import GlmError
from glm_dist.eval.run import load_checkpoint_model
from glm_dist.families.registry import exported_module, family, resolve


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """Write ``out_dir`` whole or not at all: the adapter writes a hidden sibling folder, whose files
    replace ``out_dir``'s only once every one is written (a full disk leaves no config without weights)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise GlmError(f"--out {out} is a file; give a folder for the transformers model (it is created)")
    model, meta = load_checkpoint_model(checkpoint)
    name = meta["model_family"]
    spec = family(name)
    if spec.hf is None:
        raise GlmError(f"checkpoint {checkpoint} is a {name} model, which has no transformers export")
    part = exported_module(name, model)  # e.g. ELECTRA's discriminator, what is fine-tuned
    out.parent.mkdir(parents=True, exist_ok=True)
    new = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    new.mkdir()
    try:
        with tempfile.TemporaryDirectory() as tmp:  # the checkpoint's tokenizer (local or remote) as a file
            tokenizer = Path(tmp) / "tokenizer.json"
            checkpoint_tokenizer(checkpoint)  # it parses (one line if not)
            tokenizer.write_bytes(
                checkpoint_storage(str(checkpoint)).read("tokenizer.json", max_bytes=MAX_TOKENIZER_BYTES)
            )
            resolve(f"{spec.hf}:export_hf")(
                part.cfg,
                part.state_dict(),
                str(new),
                tokenizer_file=str(tokenizer),
                profile=meta["config"]["data"]["tokenizer_profile"],
            )
        _publish(new, out)
    finally:
        shutil.rmtree(new, ignore_errors=True)
    return out


def _shareable(folder: Path) -> None:
    """Give every file the mode a new file gets under the umask (0644 under the usual 022): safetensors
    writes its weights 0600, which would leave a model folder on shared storage whose config the other
    users can read and whose weights they cannot."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)


# weight files transformers loads by name: one of an earlier export that this one did not write would be
# read instead of (model.safetensors before an index) or beside (a stale shard) the new weights
WEIGHTS = ("model*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json")


def _publish(new: Path, out: Path) -> None:
    """Move the finished export to ``out``: one rename for a new folder, else file by file (renames on one
    filesystem, which cannot run out of space), replacing what an earlier export wrote there and removing
    its weight files this export has not (a single file then, shards now, or the reverse); other files
    (a model card the user added) stay."""
    _shareable(new)
    if not out.exists():
        os.rename(new, out)
        return
    written = {path.relative_to(new) for path in new.rglob("*") if path.is_file()}
    for rel in sorted(written):
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(new / rel, target)
    for pattern in WEIGHTS:
        for stale in out.glob(pattern):
            if stale.relative_to(out) not in written:
                stale.unlink()
