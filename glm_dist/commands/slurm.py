"""``glm slurm``: queue a training, tokenizing or crawl job with sbatch (``glm_dist/slurm.py`` parses its
options, which the command's action follows)."""

from __future__ import annotations

import sys

from glm_dist import slurm

HELP = "glm slurm submit -c CONFIG --nodes N ... (see glm slurm submit --help)"


def main(argv: list[str]) -> int:
    """A layout or an sbatch refusal (``RuntimeError``) is the user's: one line, exit code 2."""
    try:
        return slurm.main(argv)
    except RuntimeError as err:
        print(f"glm slurm: error: {err}", file=sys.stderr)
        return 2
