"""A fork server for the tests' script runs: one Python that has imported torch, torch._dynamo and torchvision once,
forking a fresh child for each `conftest.run` of a project script.

Why: on a slow 2-core host `import torch` costs 4.4 s of CPU and the first `torch.optim.AdamW(...)` 3.9 s more (its
`__init__` is wrapped by `torch._disable_dynamo`, which imports torch._dynamo at its first call): 8 of the 9.5 s of a
short training run, paid again by every one of the hundreds of runs the tests make. A child forked from this process
has both already; everything else (the project's own modules, the data, the script) it loads itself, so a script runs
as it would in a fresh interpreter: `python script.py args` in `cwd`, with `env`, stdout and stderr to files, and
the interpreter's exit code (`SystemExit`'s code, 1 after an uncaught exception printed by `sys.excepthook`, -N when
signal N killed it).

Protocol, one connection per run: the client sends one JSON line {argv, cwd, env} with its stdin, stdout and stderr
as file descriptors (SCM_RIGHTS); this server forks a handler, which forks the child, sends back {"pid": child pid}
and then {"status": exit code} when the child ends, or kills the child if the client goes away first.
`conftest.run` falls back to a plain subprocess where a fork would not be the same as a fresh interpreter (PYTHONPATH
or a thread-count variable other than this server's, `-m` / `-c`, a stdin). The server exits when its parent (the
pytest worker) does. `python tests/zygote.py SOCKET`; `tests/zygote_python` is a `python` for bench.py's --python
that runs scripts through it (`as_python`).
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
import threading

# Read when the server imports torch (OpenMP reads its thread count once; the import path is set then): a run whose
# environment sets one of these otherwise than the server's needs a fresh interpreter.
FIXED = ("PYTHONPATH", "PYTHONHOME", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "CUDA_VISIBLE_DEVICES")


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


def handle(connection: socket.socket) -> None:
    """In a forked handler: read the request and the client's 3 file descriptors, fork the script's child, report its
    pid, wait for it and report its status. A client that goes away first (killed) takes the child with it."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
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
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os._exit(0)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        readable, _, _ = select.select([connection], [], [], 0.1)
        if readable and not connection.recv(1):  # the client closed: killed, or it gave up (timeout)
            os.kill(pid, signal.SIGKILL)
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
    """`tests/zygote_python argv...`: a `python` for bench.py's --python and for torchrun's workers (`torchrun
    --no-python tests/zygote_python script.py ...`). `script.py args` runs in a child of the zygote whose socket
    ZYGOTE_SOCKET names (its environment in ZYGOTE_FIXED), on this process's stdin, stdout and stderr, and this
    process ends as the child did: its exit code, or killed by the same signal. SIGTERM, SIGINT, SIGHUP, SIGUSR1 and
    SIGUSR2 sent to this process go on to the child (a preempted worker stops as it would), and SIGKILL takes the
    child with it (the handler sees the connection close). Anything else (`-m torch.distributed.run ...`, another
    environment) replaces this process with the real interpreter (ZYGOTE_REAL_PYTHON)."""
    env, real = dict(os.environ), os.environ["ZYGOTE_REAL_PYTHON"]
    fixed = json.loads(env.get("ZYGOTE_FIXED", "null"))
    if not (argv and argv[0].endswith(".py") and fixed == {k: env.get(k) for k in FIXED}):
        os.execv(real, [real, *argv])
    child = {}

    def forward(signum, _):
        if "pid" not in child:  # not started yet: die at once, the closed connection stops it
            os._exit(128 + signum)
        os.kill(child["pid"], signum)

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, forward)
    status = client(argv, os.getcwd(), env, [0, 1, 2], env["ZYGOTE_SOCKET"], started=lambda pid: child.update(pid=pid))
    if status < 0:  # killed by a signal: so is this process, for whoever waits on it (torchrun, the bench)
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


def main() -> None:
    import torch._dynamo  # noqa: F401  what torch.optim's first __init__ would import: 3.9 s
    import torchvision  # noqa: F401

    path, parent = sys.argv[1], os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    server.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a test's Ctrl-C to its process group is not for this server
    print("ready", flush=True)
    while os.getppid() == parent:  # the pytest worker that started it is gone: so is this server
        try:
            connection, _ = server.accept()
        except TimeoutError:
            continue
        connection.settimeout(None)
        if os.fork() == 0:
            server.close()
            handle(connection)
        connection.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--client"]:
        as_python(sys.argv[2:])
    main()
