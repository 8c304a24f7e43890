"""The embedded default corpus: the standard library's documentation rendered by ``pydoc``.

It ships with every Python install, so the quickstart and the tests need no download. Rendering
imports modules, some of which have side effects (``this`` prints, ``antigravity`` opens a
browser), so it runs in a child process and skips those.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Iterator

# Modules whose import has side effects or needs a display/terminal.
SKIP = {
    "this",
    "antigravity",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "pydoc",
    "sre_compile",
    "sre_constants",
    "sre_parse",
    "curses",
    "lib2to3",
    "xxlimited",
    "xxsubtype",
    "msvcrt",
    "winreg",
    "winsound",
    "nt",
    "_winapi",
    "sys",
}  # sys's page lists this process's argv, paths and flags
MAX_DOC_CHARS = 6000  # long module pages are cut at paragraph breaks into documents of this size


def _render_all() -> None:  # runs in the child process; writes JSONL to stdout
    import importlib
    import io
    import os
    import pydoc
    import warnings

    warnings.simplefilter("ignore")
    # Install paths appear in some pages (sys.path, sys.executable, ...): replace them so the corpus
    # is the same in every checkout and virtual environment.
    paths = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix}, key=len, reverse=True)
    out = sys.stdout
    sys.stdout = io.StringIO()  # swallow anything a module prints on import
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in SKIP:
            continue
        try:
            module = importlib.import_module(name)
            text = pydoc.render_doc(module, renderer=pydoc.plaintext)
        except BaseException:  # a module that cannot import here (platform, optional deps)
            continue
        # Drop the install-specific "FILE /path/to/module.py" section so the corpus is portable.
        text = "\n".join(line for line in text.splitlines() if not line.strip().startswith(os.sep))
        for path in paths:
            text = text.replace(path, "<prefix>")
        text = re.sub(r" at 0x[0-9a-f]+|, handle [0-9a-f]+", "", text)  # addresses differ from run to run
        out.write(json.dumps({"module": name, "text": text}) + "\n")
    out.flush()


def split_paragraphs(text: str, max_chars: int) -> list[str]:
    """Cut ``text`` into pieces of at most ~``max_chars`` characters, preferring blank lines
    (pydoc's blank lines may hold only spaces or a ``|`` gutter)."""
    pieces, current, size = [], [], 0
    for line in text.splitlines():
        blank = line.strip(" |") == ""
        if current and (size > max_chars or (blank and size > max_chars // 2)):
            pieces.append("\n".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line) + 1
    if current:
        pieces.append("\n".join(current))
    return [p for p in pieces if p.strip()]


def clean_render(function: str, *, timeout: float = 600) -> list[str]:
    """The stdout lines of ``function`` (``"module:name"`` of this repository's packages) called in a
    clean interpreter. Pages rendered from imported modules must not carry this machine's variables
    (cgi's default arguments print os.environ), the checkout's path, or the side effects of whatever
    the calling process imported before, so every clone renders the same bytes. The package is found
    from the working directory (``-c`` puts it first on sys.path), not PYTHONPATH."""
    module, name = function.split(":")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", f"from {module} import {name}; {name}()"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=here,
        timeout=timeout,
    )
    return proc.stdout.splitlines()


def embedded_documents() -> Iterator[dict]:
    """Yield ``{"id", "text"}`` documents of the embedded pydoc corpus, in a fixed order."""
    for line in clean_render("data_pipeline.embedded:_render_all"):
        page = json.loads(line)
        for k, piece in enumerate(split_paragraphs(page["text"], MAX_DOC_CHARS)):
            yield {"id": f"pydoc:{page['module']}#{k}", "text": piece}


TASK_MODULES = ("math", "shutil", "tarfile", "calendar", "urllib.parse")


def docstring_task(modules: tuple[str, ...] = TASK_MODULES) -> list[dict]:
    """A small real classification task from text that ships with Python: which standard-library
    module does a docstring (first paragraph) come from? Functions, classes and their methods."""
    import importlib
    import inspect

    rows = []
    for name in modules:
        module = importlib.import_module(name)
        seen = set()
        members = [obj for _, obj in inspect.getmembers(module) if getattr(obj, "__module__", None) == name]
        members += [
            m
            for c in members
            if inspect.isclass(c)
            for _, m in inspect.getmembers(c)
            if inspect.isroutine(m) and getattr(m, "__module__", None) == name
        ]
        for obj in members:
            doc = inspect.getdoc(obj)
            text = doc.split("\n\n")[0].replace("\n", " ").strip() if doc else ""
            if len(text) >= 20 and text not in seen:
                seen.add(text)
                rows.append({"text": text, "label": name})
    return rows
