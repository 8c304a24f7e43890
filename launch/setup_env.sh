#!/usr/bin/env bash
# Create ./.venv and install glm-dist into it (editable). Idempotent; pip's log: .venv/install.log
#   EXTRAS=test  also installs the test dependencies (transformers, pytest)
#   TORCH_SPEC   what to install for torch first (default torch==2.13.0: the CPU build on the
#                project's CI machines; on a CUDA machine PyPI serves the CUDA build of the same
#                release -- or set your own, e.g. TORCH_SPEC="torch --index-url <your CUDA index>").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
log=.venv/install.log
install() {
  echo "+ pip install $*" >> "$log"
  python -m pip install --progress-bar off "$@" >> "$log" 2>&1 || { echo "pip install $* failed; see $log" >&2; tail -20 "$log" >&2; exit 1; }
}
install --upgrade pip
# torch first, pinned, so that nothing below pulls a different (multi-GB CUDA) build.
python -c "import torch" 2>/dev/null || install ${TORCH_SPEC:-torch==2.13.0}
install -e ".${EXTRAS:+[$EXTRAS]}"
# Real text and labels the tests and offline eval tasks read, from Debian packages (installed where
# apt-get exists and we are root; elsewhere install them yourself):
#   wordnet-base  WordNet's database (data_pipeline/wordnet.py: senses, parts of speech, glosses, examples)
#   manpages      Linux's manual pages (data_pipeline/manpages.py: the 'manpages' source of data mixtures)
#   python3-doc   Python's HTML documentation (Sphinx markup of Python objects; the FAQ's questions and answers)
#   gettext       msgunfmt (a compiled .mo catalog back to .po: the .po reader's test)
#   iso-codes libc-l10n gnupg-l10n krb5-locales git libglib2.0-data libgtk2.0-common xkb-data wget
#   binutils-common procps shared-mime-info gsettings-desktop-schemas
#                 their German gettext catalogs (/usr/share/locale/de/LC_MESSAGES/*.mo, ~40k messages with the
#                 essential packages' own): CoVe's English -> German translation pairs (glm data gettext)
APT_PACKAGES=(wordnet-base manpages python3-doc gettext iso-codes libc-l10n gnupg-l10n krb5-locales git
              libglib2.0-data libgtk2.0-common xkb-data wget binutils-common procps shared-mime-info
              gsettings-desktop-schemas)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "+ apt-get install -y ${missing[*]}" >> "$log"
  { apt-get install -y --no-install-recommends "${missing[@]}" \
      || { apt-get update && apt-get install -y --no-install-recommends "${missing[@]}"; }; } >> "$log" 2>&1 \
    || echo "warning: apt-get install ${missing[*]} failed (see $log); the tests that read them will say so" >&2
fi
python -c "import torch, deepspeed, glm_dist" 2>/dev/null || { echo "setup failed: torch/deepspeed/glm_dist do not import" >&2; exit 1; }
# DeepSpeed's CPU collective op, built now rather than inside the first training process (and any
# stale lock of a killed build removed): see launch/build_ops.py
python launch/build_ops.py 2>&1 | grep -v "Setting accelerator to CPU" || { echo "setup failed: launch/build_ops.py" >&2; exit 1; }
