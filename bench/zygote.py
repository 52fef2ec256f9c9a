"""The fork server: one Python that has imported torch, torch._dynamo and torchvision once, forking a fresh child for
each run of a project script. bench/bench.py runs its single-process rows through it, and the tests their scripts.

Why: `import torch` costs 1.5 s of CPU on an AVX512 EPYC core (4.4 s on a slow 2-core host) and the first
`torch.optim.AdamW(...)` 1.3 s more (its `__init__` is wrapped by `torch._disable_dynamo`, which imports torch._dynamo
at its first call): more than half of what a short bench run spends outside its training steps, paid again by every
run. A child forked from this process has both already; everything else (the project's own modules, the data, the
script) it loads itself, so a script runs as it would in a fresh interpreter: `python script.py args` in `cwd`, with
`env`, stdout and stderr to the client's, its own session (so that its DataLoader workers go with it), and the
interpreter's exit code (`SystemExit`'s code, 1 after an uncaught exception printed by `sys.excepthook`, -N when
signal N killed it).

A fork is clean only if the server is (`clean_fork_check`, run at start-up; the server refuses to serve otherwise):
- one thread: a C++ object that owns a thread (a pool, a store's listener) is copied by fork() without its thread and
  can abort when its destructor runs at exit. The server starts none; OpenBLAS's pool, which numpy starts at import,
  is joined by OpenBLAS's own pthread_atfork handler before every fork. Checked: right after a test fork the server
  has exactly one thread, so nothing but the forking thread existed at the fork.
- CUDA not started: a CUDA context does not survive fork(), so CUDA must start in the child, never before the fork.
  The server never touches CUDA (no torch.cuda call: even `is_available()` initialises the driver); checked with
  torch's own flag, and on a machine with a GPU the bench makes a forked child start CUDA before it trusts the server.

Protocol, one connection per run: the client sends one JSON line {argv, cwd, env} with its stdin, stdout and stderr
as file descriptors (SCM_RIGHTS); this server forks a handler, which forks the child, sends back {"pid": child pid}
and then {"status": exit code} when the child ends, or kills the child's process group if the client goes away
first. Where a fork would not be the same as a fresh interpreter (an environment variable read at import other than
this server's: PYTHONPATH, a thread count, TORCH_LOGS, TORCHINDUCTOR_*...: `fixed_env`; `-m` / `-c`; a stdin), the
caller runs a plain subprocess. The server exits when its parent does.

    python bench/zygote.py SOCKET          # the server (bench.py and tests/conftest.py start it with `start`)
    bench/zygote_python script.py args     # a `python` that runs script.py in a child of the server (`as_python`)
"""

import atexit
import io
import json
import os
import random
import runpy
import select
import signal
import socket
import sys
import subprocess
import tempfile
import threading
import time

# Read when the server imports torch, not when a child runs: OpenMP's thread count, the import path, a preloaded
# allocator, the visible GPUs, torch's own variables (TORCH_LOGS, TORCHINDUCTOR_*, TORCH_COMPILE_*, PYTORCH_*: their
# modules read them at import) and the instruction-set limits of its CPU kernels (ONEDNN_MAX_CPU_ISA,
# ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS: read once, at the first kernel). A run whose environment sets one of
# these otherwise than the server's needs a fresh interpreter.
FIXED = ("PYTHONPATH", "PYTHONHOME", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "CUDA_VISIBLE_DEVICES")
FIXED_PREFIXES = ("TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "CUDA_", "NCCL_", "CUBLAS_", "CUDNN_", "ONEDNN_", "ATEN_")


def fixed_env(env) -> dict:
    """The part of environment `env` that a forked child cannot change: FIXED's names (None when unset) and every
    variable whose name starts with one of FIXED_PREFIXES. Two environments with equal fixed_env fork alike."""
    fixed = {key: env.get(key) for key in FIXED}
    fixed.update({key: value for key, value in env.items() if key.startswith(FIXED_PREFIXES)})
    return fixed


def exit_code(code) -> int:
    """The status `sys.exit(code)` gives a fresh interpreter: None 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def script_child(request: dict, fds: list[int]) -> None:
    """In the forked child: become `python argv...` with stdin, stdout and stderr the client's `fds`, and exit as that
    interpreter would (never returns)."""
    code = 1
    try:
        os.setsid()  # a session and process group of its own: the handler can kill it with its DataLoader workers
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the dispositions a fresh interpreter starts with
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        random.seed()  # a fresh interpreter's unseeded generators differ from run to run; forked ones would not
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)
        sys.stdout, sys.stderr = (
            io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), write_through=True, line_buffering=True)
            for fd in (1, 2)
        )  # unbuffered, as PYTHONUNBUFFERED makes them: nothing is lost when a test SIGKILLs the run
        script, *args = request["argv"]
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(os.path.abspath(script), run_name="__main__")  # __main__.__file__ absolute, as in 3.9+
            code = 0
        except SystemExit as stop:
            code = exit_code(stop.code)
        except BaseException:  # noqa: BLE001  printed as the interpreter prints it (the scripts' own excepthook too)
            code = 130 if isinstance(sys.exc_info()[1], KeyboardInterrupt) else 1
            try:
                sys.excepthook(*sys.exc_info())
            except SystemExit as stop:  # a hook that exits sets the code, as in the interpreter (common.cli's does)
                code = exit_code(stop.code)
        threading._shutdown()  # as the interpreter's exit: non-daemon threads, then atexit functions
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(code)


def kill_group(pid: int) -> None:
    """SIGKILL the child `pid` and its process group (its DataLoader workers); the child leads its group from its
    first line on, and until then it is alone in the handler's group, which it then leaves."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def handle(connection: socket.socket) -> None:
    """In a forked handler: read the request and the client's 3 file descriptors, fork the script's child, report its
    pid, wait for it and report its status. A client that goes away first (killed) takes the child with it."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    quiet = os.open(os.devnull, os.O_WRONLY)  # the server's stdout and stderr are its caller's (a pipe into tee
    os.dup2(quiet, 1)  # in bench/lease.sh): a handler waiting on a run that outlives the caller must not hold it open
    os.dup2(quiet, 2)
    os.close(quiet)
    data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = connection.recv(1 << 20)
        if not more:  # the client went away before its request was whole
            os._exit(0)
        data += more
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:
        connection.close()
        script_child(request, fds)
    for fd in fds:
        os.close(fd)
    try:
        connection.sendall((json.dumps({"pid": pid}) + "\n").encode())
    except OSError:  # the client went away: so does its run
        kill_group(pid)
        os.waitpid(pid, 0)
        os._exit(0)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        readable, _, _ = select.select([connection], [], [], 0.1)
        if readable and not connection.recv(1):  # the client closed: killed, or it gave up (timeout)
            kill_group(pid)
            os.waitpid(pid, 0)
            os._exit(0)
    connection.sendall((json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n").encode())
    os._exit(0)


def client(
    argv: list[str], cwd: str, env: dict, fds: list[int], path: str, timeout: float | None = None, started=None
) -> int:
    """Run `python argv...` in a child of the zygote at `path`, with `fds` as its stdin, stdout and stderr; return its
    exit code, -N when signal N killed it (raises TimeoutError after `timeout` seconds, having killed it). `started`,
    if given, is called with the child's pid once it runs."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(path)
    try:
        message = (json.dumps({"argv": argv, "cwd": cwd, "env": env}) + "\n").encode()
        socket.send_fds(connection, [message], fds)
        stream = connection.makefile("r")
        try:
            pid = json.loads(stream.readline())["pid"]  # the child runs
            if started is not None:
                started(pid)
            connection.settimeout(timeout)
            return json.loads(stream.readline())["status"]
        finally:
            stream.close()
    finally:
        connection.close()  # before the child ended (a timeout, a signal): the handler kills it


def as_python(argv: list[str]) -> None:
    """`bench/zygote_python argv...`: a `python` for the bench's runs and for torchrun's workers in the tests
    (`torchrun --no-python bench/zygote_python script.py ...`). `script.py args` runs in a child of the zygote whose socket
    ZYGOTE_SOCKET names (its environment in ZYGOTE_FIXED), on this process's stdin, stdout and stderr, and this
    process ends as the child did: its exit code, or killed by the same signal. SIGTERM, SIGINT, SIGHUP, SIGUSR1 and
    SIGUSR2 sent to this process go on to the child (a preempted worker stops as it would; one that comes before the
    child's pid is read, as soon as it is), and SIGKILL takes the child with it (the handler sees the connection
    close). Anything else (`-m torch.distributed.run ...`, another
    environment) replaces this process with the real interpreter (ZYGOTE_REAL_PYTHON)."""
    env, real = dict(os.environ), os.environ.get("ZYGOTE_REAL_PYTHON", sys.executable)
    fixed = json.loads(env.get("ZYGOTE_FIXED", "null"))
    if not (argv and argv[0].endswith(".py") and fixed == fixed_env(env) and "ZYGOTE_SOCKET" in env):
        os.execv(real, [real, *argv])
    child = {}

    def forward(signum, _):
        if "pid" not in child:  # its pid not read yet (the child may already run): passed on once it is
            child["pending"] = signum
            return
        os.kill(child["pid"], signum)

    def started(pid):
        child["pid"] = pid
        if "pending" in child:
            os.kill(pid, child["pending"])

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, forward)
    try:
        status = client(argv, os.getcwd(), env, [0, 1, 2], env["ZYGOTE_SOCKET"], started=started)
    except (OSError, ValueError) as error:  # the server went away before it answered
        if "pending" in child:  # a signal came first: end as it would have ended this process
            signal.signal(child["pending"], signal.SIG_DFL)
            os.kill(os.getpid(), child["pending"])
        raise SystemExit(f"zygote: the fork server did not answer ({error})") from None
    if status < 0:  # killed by a signal: so is this process, for whoever waits on it (torchrun, the bench)
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


def threads() -> int:
    """The threads of this process (Linux: /proc/self/task)."""
    return len(os.listdir("/proc/self/task"))


def clean_fork_check() -> str | None:
    """Why a fork of this process would not be clean, or None: fork a child that exits at once, then count this
    process's threads (more than one: a thread that no pthread_atfork handler stopped was there at the fork, and the
    child got a copy of its owner without it) and ask torch whether CUDA has started here (its lazy-init flag: a
    CUDA context cannot be forked)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    if threads() != 1:
        return f"{threads()} threads at a fork (a thread that fork() does not copy: its owner would abort at exit)"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised before the fork (it must start in the child)"
    return None


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="the fork server: imports torch once, forks a child per run")
    parser.add_argument("socket", help="the Unix socket to listen on (its folder must exist)")
    path = parser.parse_args().socket
    started = time.perf_counter()
    import torch._dynamo  # noqa: F401  what torch.optim's first __init__ would import: 1.3 s
    import torchvision  # noqa: F401

    imported = time.perf_counter() - started
    problem = clean_fork_check()
    if problem:
        print(f"unclean: {problem}", flush=True)
        raise SystemExit(3)
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    server.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the caller's process group is not for this server
    print(f"ready {imported:.2f}", flush=True)  # the seconds of imports each forked run is spared
    while os.getppid() == parent:  # the process that started it is gone: so is this server
        try:
            connection, _ = server.accept()
        except TimeoutError:
            continue
        connection.settimeout(None)
        torch = sys.modules["torch"]
        if torch.cuda.is_initialized():  # never, unless something here changed: then no fork, the client fails
            connection.close()
            continue
        if os.fork() == 0:
            server.close()
            handle(connection)
        connection.close()


class Server:
    """A running fork server (`start`): `path` its socket, `import_s` the seconds of imports a forked run is spared,
    `env(base)` the environment in which `bench/zygote_python` runs scripts through it, `close()` to stop it."""

    def __init__(self, process: subprocess.Popen, folder: str, import_s: float, python: str, fixed: dict):
        self.process, self.folder, self.import_s, self.python, self.fixed = process, folder, import_s, python, fixed
        self.path = os.path.join(folder, "socket")

    def env(self, base: dict | None = None) -> dict:
        """`base` (default os.environ) plus what `as_python` needs to reach this server."""
        return {
            **(os.environ if base is None else base),
            "ZYGOTE_SOCKET": self.path,
            "ZYGOTE_REAL_PYTHON": self.python,
            "ZYGOTE_FIXED": json.dumps(self.fixed),
        }

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.alive():
            self.process.kill()
            self.process.wait()
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


class Unclean(RuntimeError):
    """The fork server did not start, or found that a fork of it would not be clean: run fresh interpreters."""


def start(python: str = sys.executable, env: dict | None = None, cwd: str | None = None) -> Server:
    """Start `python bench/zygote.py SOCKET` in `env` (default os.environ), in a session of its own, and wait until
    it has imported torch and passed `clean_fork_check`; raises Unclean with its reason otherwise. Its stderr is the
    caller's; it exits when the caller does (or at `Server.close()`)."""
    env = dict(os.environ if env is None else env)
    folder = tempfile.mkdtemp(prefix="zygote-")
    # A session of its own: a signal to the caller's process group (timeout's SIGTERM, a hang-up) is the caller's to
    # handle; had it reached the handlers, a run in flight would lose the process that reports its end.
    process = subprocess.Popen(
        [python, os.path.abspath(__file__), os.path.join(folder, "socket")], cwd=cwd, env=env,
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    line = process.stdout.readline().strip()
    if not line.startswith("ready"):
        process.kill()
        process.wait()
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
        raise Unclean(line.removeprefix("unclean: ") or f"the server exited ({process.returncode})")
    return Server(process, folder, float(line.split()[1]), python, fixed_env(env))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--client"]:
        as_python(sys.argv[2:])
    main()
