"""The Python environment of bench/gpu_check.sh, made offline from the Python at hand.

The GPU machine's ``python3`` is itself a virtual environment (its torch, CUDA and transformers live in
that venv's site-packages). A venv made from it is based on the interpreter beneath, so
``--system-site-packages`` shows that interpreter's packages, not the venv's: no torch. Instead the new
venv gets a ``.pth`` file that adds each of the parent's site directories with ``site.addsitedir`` (so
the parent's own ``.pth`` files run too) and the repository, after its own site-packages: what the
check installs there wins, everything else is the parent's. The environment travels with the
interpreter, not with variables, so a test's child process started with a cleaned environment (no
PYTHONPATH) imports the same packages.

Then pip installs what is missing from ``--wheels`` with no index (``bash bench/gpu_check.sh --prepare``
fills it on a networked machine; requirements the parent already meets are left alone), after
checking that the wheels were made for this Python.

    python3 bench/gpu_check_env.py VENV --wheels DIR --repo DIR PACKAGE...   # prints the venv's python
"""

from __future__ import annotations

import argparse
import json
import os
import re
import site
import subprocess
import sys
from pathlib import Path

PTH_NAME = "glm_gpu_check.pth"
# name-version(-build)?-python-abi-platform.whl (PEP 427); a tag may be a dotted set (py2.py3)
WHEEL = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?"
    r"-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$"
)


def wheels_not_for(wheels: list[str], version: tuple[int, int]) -> list[str]:
    """The wheel files of ``wheels`` that CPython ``version`` cannot install: a binary wheel for
    another CPython (``cp312`` under 3.11), or a stable-ABI one (``abi3``) newer than it."""
    ours, refused = f"cp{version[0]}{version[1]}", []
    for name in wheels:
        found = WHEEL.match(Path(name).name)
        if found is None:
            refused.append(f"{name} (not a wheel's file name)")
            continue
        tags = found["python"].split(".")
        if any(t in (ours, f"py{version[0]}", f"py{version[0]}{version[1]}") for t in tags):
            continue
        if found["abi"] == "abi3" and any(t.startswith("cp") and (int(t[2]), int(t[3:])) <= version for t in tags):
            continue
        refused.append(f"{Path(name).name} (for {found['python']}, this Python is {version[0]}.{version[1]})")
    return refused


def check_wheels(wheels: Path, version: tuple[int, int]) -> None:
    """Stop with what to do when ``--prepare`` made the wheels for another Python."""
    prepared = wheels / "prepared.json"
    made_for = json.loads(prepared.read_text())["python"] if prepared.exists() else None
    refused = wheels_not_for(sorted(p.name for p in wheels.glob("*.whl")), version)
    if refused or (made_for and made_for != f"{version[0]}.{version[1]}"):
        sys.exit(
            f"gpu_check: the wheels in {wheels} were prepared for Python {made_for or '?'}, this one is "
            f"{version[0]}.{version[1]} ({sys.executable}): {'; '.join(refused) or 'see ' + str(prepared)}. "
            f"Run GLM_GPU_CHECK_PYTHON_VERSION={version[0]}.{version[1]} bash bench/gpu_check.sh --prepare "
            f"on a networked machine"
        )


def parent_site_dirs() -> list[str]:
    """This interpreter's site-packages folders (a venv's own, and its base's where it includes them)."""
    return [d for d in dict.fromkeys(site.getsitepackages()) if os.path.isdir(d)]


def make_venv(venv: Path, repo: Path) -> Path:
    """A venv from this interpreter that sees its packages and ``repo`` (see the module's doc)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    lines = [str(repo)] + [f"import site; site.addsitedir({d!r})" for d in parent_site_dirs()]
    Path(purelib, PTH_NAME).write_text("\n".join(lines) + "\n")
    return python


def install(python: Path, wheels: Path, packages: list[str]) -> None:
    """pip (this interpreter's) installs ``packages`` into ``python``'s venv from ``wheels`` only;
    those the parent's packages already satisfy stay as they are."""
    links = ["--find-links", str(wheels)] if wheels.is_dir() else []
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-index",
            "--disable-pip-version-check",
            "--no-cache-dir",
            *links,
            *packages,
        ]
    )
    if proc.returncode:
        sys.exit(
            f"gpu_check: pip could not install {' '.join(packages)} from {wheels} without a network "
            f"(exit {proc.returncode}, its message above): run bash bench/gpu_check.sh --prepare on a "
            f"networked machine, or add the missing package to GLM_GPU_CHECK_PACKAGES there"
        )


def imports_in_child(python: Path, modules: list[str]) -> dict[str, str]:
    """Where ``python`` finds ``modules`` in a child started with a cleaned environment (PATH and HOME
    only: no PYTHONPATH, no VIRTUAL_ENV), as the tests start theirs."""
    code = f"import importlib, json; print(json.dumps({{m: importlib.import_module(m).__file__ for m in {modules!r}}}))"
    env = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    proc = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(
            f"gpu_check: {python} cannot import {', '.join(modules)} in a clean environment:\n{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("venv", type=Path)
    ap.add_argument("packages", nargs="+", help="what the check imports beyond the parent's packages")
    ap.add_argument("--wheels", type=Path, required=True)
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument(
        "--imports",
        default="torch,deepspeed,webdataset,wandb,tokenizers,transformers,pytest,glm_dist",
        help="modules the made environment must import",
    )
    args = ap.parse_args()
    version = sys.version_info[:2]
    if args.wheels.is_dir():
        check_wheels(args.wheels, version)
    print(
        f"parent: {sys.executable} (Python {version[0]}.{version[1]}; a venv: {sys.prefix != sys.base_prefix}); "
        f"site folders {parent_site_dirs()}"
    )
    python = make_venv(args.venv, args.repo.resolve())
    install(python, args.wheels, args.packages)
    found = imports_in_child(python, args.imports.split(","))
    print(json.dumps({"python": str(python), "modules": found}))


if __name__ == "__main__":
    main()
