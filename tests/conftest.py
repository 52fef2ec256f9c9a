"""Shared helpers: run a project script as a real subprocess, find the real Fashion-MNIST files, skip GPU tests."""

import ast
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
BENCH = REPO / "bench"  # the runner at its top; pages, data preparation and studies in folders of their own
sys.path[1:1] = [str(BENCH), str(BENCH / "pages"), str(BENCH / "prepare"), str(BENCH / "studies")]

import common  # noqa: E402
import zygote  # noqa: E402  (bench/zygote.py, the fork server: the standard library only, until a server starts)


def run(*argv, timeout=600, env=None, **kwargs) -> subprocess.CompletedProcess:
    """Run `python argv...` from the repository root (in `env`, default this process's environment); return the
    finished process with text stdout/stderr. A script (`argv[0]` a .py file) runs in a child of bench/zygote.py,
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
_ZYGOTE_ENV = dict(os.environ)  # what the zygote starts with (a test's monkeypatch.setenv later does not reach it)


def _forkable(argv: list[str], env: dict) -> bool:
    return (
        "TESTS_NO_ZYGOTE" not in os.environ
        and bool(argv)
        and argv[0].endswith(".py")
        and zygote.fixed_env(env) == zygote.fixed_env(_ZYGOTE_ENV)
    )


TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def torchrun_command(*argv, env=None) -> tuple[list[str], dict]:
    """The command `python -m torch.distributed.run argv...` (torchrun's flags, then the script and its flags) and its
    environment (default this process's): each worker runs the script in a child of this process's zygote (torchrun's
    --no-python, with bench/zygote_python as the program), or in a fresh interpreter where the worker's environment
    differs from the zygote's (zygote.py) or TESTS_NO_ZYGOTE is set."""
    argv, env = [str(a) for a in argv], dict(os.environ if env is None else env)
    if "TESTS_NO_ZYGOTE" in os.environ:
        return [*TORCHRUN, *argv], env
    at = next(i for i, a in enumerate(argv) if a.endswith(".py"))
    python = str(REPO / "bench" / "zygote_python")
    return [*TORCHRUN, *argv[:at], "--no-python", python, *argv[at:]], zygote_python_env(env)


def torchrun(*argv, env=None, timeout=600) -> subprocess.CompletedProcess:
    """Run `torchrun argv...` from the repository root (see torchrun_command); the finished process, text output.
    torchrun's agent itself runs in a child of the zygote too (torch/distributed/run.py as the script), where it can."""
    command, env = torchrun_command(*argv, env=env)
    agent = [importlib.util.find_spec("torch.distributed.run").origin, *command[len(TORCHRUN) :]]
    if _forkable(agent, env):
        return _zygote_run(agent, {**env, "PYTHONUNBUFFERED": "1"}, timeout)
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def zygote_python_env(env=None) -> dict:
    """`env` (default this process's environment) for torchrun's workers run by `bench/zygote_python`: their runs of
    scripts fork from this process's fork server."""
    return _zygote().env(os.environ if env is None else env)


def _zygote() -> "zygote.Server":
    """This process's fork server (bench/zygote.py), started at the first call (it imports torch: seconds)."""
    if _ZYGOTE.get("pid") != os.getpid() or not _ZYGOTE["server"].alive():  # none yet, or it was killed
        import atexit

        server = zygote.start(env=_ZYGOTE_ENV, cwd=str(REPO))
        atexit.register(server.close)
        _ZYGOTE.update(pid=os.getpid(), server=server)
    return _ZYGOTE["server"]


def _zygote_socket() -> str:
    return _zygote().path


def _zygote_run(argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, open(os.devnull) as null:
        try:
            fds = [null.fileno(), out.fileno(), err.fileno()]
            status = zygote.client(argv, str(REPO), env, fds, _zygote_socket(), timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout) from None
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([sys.executable, *argv], status, out.read(), err.read())


def script_definitions(script: str, names: tuple[str, ...], namespace: dict) -> dict:
    """The top-level functions, classes and assignments `names` of `script` (a path under the repository), their
    source compiled alone into `namespace` (the modules they use), which is returned: a test runs the script's own
    code, not a copy, without running the script. Fails when one of `names` is not defined there."""

    def name(node):  # a def's or class's name, or the name an assignment binds
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        return getattr(node, "name", None) or getattr(target, "id", None)

    nodes = [n for n in ast.parse((REPO / script).read_text()).body if name(n) in names]
    assert sorted(map(name, nodes)) == sorted(names), f"{script} defines {sorted(map(name, nodes))}, not {names}"
    exec(compile(ast.Module(nodes, type_ignores=[]), script, "exec"), namespace)
    return namespace


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """A clean failure: non-zero exit, no traceback, one line on stderr that contains every fragment."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]


def assert_loads_into_train_py(checkpoint: Path) -> dict:
    """The checkpoint's model state loads, strictly (every key, every shape), into the model train.py builds for
    Fashion-MNIST: no `module.` (DP / DDP) or `_orig_mod.` (torch.compile) prefix. Returns the checkpoint."""
    state = torch.load(checkpoint, weights_only=True)
    model = state["made_by"]["model"]
    shape = (84, state["model"]["embed.position.weight"].size(0)) if model in common.TEXT_MODELS else (1, 28)
    common.build_model(model, *shape).load_state_dict(state["model"])
    return state


def stopped_after_first_checkpoint(script: str, *flags, timeout=300) -> subprocess.CompletedProcess:
    """Run `script` with `flags` (which name its --checkpoint-dir) and SIGKILL it right after its first checkpoint
    is written (tests/crash_probe.py), as a preempted job is left: for a 2-epoch train.py run, last.pt holds epoch 1
    of 2, and a --resume with the same flags continues it (another --epochs would be refused: it reshapes the
    one-cycle schedule). Returns the killed process (exit -9)."""
    proc = run("tests/crash_probe.py", "0:after-save:1:0", "--", script, *flags, timeout=timeout,
               env={**os.environ, "RANK": "0"})  # fmt: skip
    assert proc.returncode == -9, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="session")
def fmnist_dir() -> Path:
    """The folder with the real Fashion-MNIST files (the set-up installs them; no download in tests)."""
    try:
        return common.data.find_fashion_mnist(download=False)
    except common.data.DataNotFound as error:
        pytest.fail(f"the test set-up should have installed Fashion-MNIST: {error}")


def vouch_for(checkpoint: Path) -> None:
    """Write the sha256 of `checkpoint` beside it (`sha256sum` format), as the save would have: a test that changes a
    checkpoint on purpose vouches for the change, so that the check it tests (after the digest's) is reached."""
    digest = hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest()
    common.checkpoint.digest_path(checkpoint).write_text(f"{digest}  {Path(checkpoint).name}\n")


def cpu_has_native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware, read apart from common.native_bfloat16 (which the tests check
    against it): /proc/cpuinfo's bf16 dot-product flags (avx512_bf16, amx_bf16), and no ONEDNN_MAX_CPU_ISA set in
    this environment (the tests that set it ask for AVX2, below them). False where /proc/cpuinfo is missing."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split())) and "ONEDNN_MAX_CPU_ISA" not in os.environ


# What a CPU without bf16 instructions runs, on any x86 CPU: oneDNN kept below AVX512-BF16 / AMX (torch then emulates
# bfloat16 matmuls, as there), ATen's and Inductor's vector code and MKL's at AVX2; Inductor's cache apart (see
# common.env.limited_inductor_cache: a graph compiled so crashes a run without the limits that loads it)
WITHOUT_BF16 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
WITHOUT_BF16["TORCHINDUCTOR_CACHE_DIR"] = f"{default_cache_dir()}-avx2"


LONGEST_FIRST = ["test_equivalence.py", "test_gpt.py", "test_smoke.py", "test_variants.py", "test_loaders.py"]


def pytest_collection_modifyitems(config, items):
    # The longest files first: tests/run.sh hands whole files to 2 processes in this order (pytest-xdist, loadfile).
    items.sort(key=lambda item: next((i for i, n in enumerate(LONGEST_FIRST) if item.path.name == n), 99))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
