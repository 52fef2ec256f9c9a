"""Shared helpers: run a project script as a real subprocess, find the real Fashion-MNIST files, skip GPU tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import common  # noqa: E402
import zygote  # noqa: E402  (tests/zygote.py: the standard library only, until its server starts)


def run(*argv, timeout=600, env=None, **kwargs) -> subprocess.CompletedProcess:
    """Run `python argv...` from the repository root (in `env`, default this process's environment); return the
    finished process with text stdout/stderr. A script (`argv[0]` a .py file) runs in a child of tests/zygote.py,
    which has imported torch already (8 s of CPU a run saved on a slow 2-core host), unless the run needs a fresh
    interpreter (see zygote.py) or TESTS_NO_ZYGOTE is set."""
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    argv = [str(a) for a in argv]
    if not kwargs and _forkable(argv, env):
        return _zygote_run(argv, env, timeout)
    return subprocess.run(
        [sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, **kwargs
    )


_ZYGOTE: dict = {}


def _forkable(argv: list[str], env: dict) -> bool:
    return (
        "TESTS_NO_ZYGOTE" not in os.environ
        and bool(argv)
        and argv[0].endswith(".py")
        and all(env.get(k) == os.environ.get(k) for k in zygote.FIXED)
    )


def zygote_python_env() -> dict:
    """The environment for `bench/bench.py --python tests/zygote_python`: its runs of scripts fork from this
    process's zygote (a bench whose runs are not killed: the smoke profile)."""
    return {
        **os.environ,
        "ZYGOTE_SOCKET": _zygote_socket(),
        "ZYGOTE_REAL_PYTHON": sys.executable,
        "ZYGOTE_FIXED": json.dumps({k: os.environ.get(k) for k in zygote.FIXED}),
    }


def _zygote_socket() -> str:
    """The socket of this process's zygote, started at the first call (it imports torch: seconds)."""
    if _ZYGOTE.get("pid") != os.getpid() or _ZYGOTE["server"].poll() is not None:  # none yet, or it was killed
        import atexit
        import tempfile

        folder = tempfile.mkdtemp(prefix="zygote-")
        path = os.path.join(folder, "socket")
        server = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "zygote.py"), path], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        assert server.stdout.readline().strip() == "ready", "tests/zygote.py did not start"
        atexit.register(server.kill)
        _ZYGOTE.update(pid=os.getpid(), path=path, server=server, folder=folder)
    return _ZYGOTE["path"]


def _zygote_run(argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, open(os.devnull) as null:
        try:
            status = zygote.client(argv, str(REPO), env, [null.fileno(), out.fileno(), err.fileno()], _zygote_socket(), timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout) from None
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([sys.executable, *argv], status, out.read(), err.read())
