"""bench/setup.sh's choice of a Python, without the network: `--plan` says which interpreter set-up would install
into and why, and changes nothing. An externally managed system Python (PEP 668: Debian 12, Ubuntu 23.04+), or any
python3 nobody chose that lacks packages, gets a virtual environment in .venv/; an active environment, $PYTHON and an earlier .venv/ are used as they are; a .venv/
left without pip is made again; bench/activate.sh makes .venv/ the shell's `python`."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = Path("/usr/bin/python3")


def system_python_is_externally_managed() -> bool:
    """Whether /usr/bin/python3 exists and is externally managed (PEP 668), read by that interpreter itself."""
    if not SYSTEM_PYTHON.exists():
        return False
    probe = "import os, sys, sysconfig; print(os.path.isfile(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))"
    out = subprocess.run([str(SYSTEM_PYTHON), "-c", probe], capture_output=True, text=True)
    return out.stdout.strip() == "True"


def tree(tmp_path: Path) -> Path:
    """A copy of what set-up's choice reads: bench/setup.sh, bench/python.sh, bench/activate.sh, requirements.txt."""
    root = tmp_path / "repo"
    (root / "bench").mkdir(parents=True)
    for name in ("bench/setup.sh", "bench/python.sh", "bench/activate.sh", "requirements.txt"):
        shutil.copy(REPO / name, root / name)
    return root


def wrapper(path: Path, target: str) -> Path:
    """An executable at `path` that runs `target` with its arguments (a python3 or .venv/bin/python stand-in)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec "{target}" "$@"\n')
    path.chmod(0o755)
    return path


def clean_env(path: str, **extra: str) -> dict:
    """The environment of a fresh login: no PYTHON, no active virtual environment or conda, PATH as given."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")}
    return {**env, "PATH": path, **extra}


def plan(root: Path, env: dict, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(root / "bench/setup.sh"), "--plan", *flags], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(not system_python_is_externally_managed(), reason="needs an externally managed /usr/bin/python3")
def test_an_externally_managed_system_python_gets_a_virtual_environment_in_the_repository(tmp_path):
    """PATH=/usr/bin:/bin, as a fresh Debian user has it: set-up says in one line that it installs into .venv/."""
    root = tree(tmp_path)
    done = plan(root, clean_env("/usr/bin:/bin"))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("setup:")]
    assert len(lines) == 1 and "externally managed" in lines[0] and ".venv/" in lines[0], done.stdout
    assert not (root / ".venv").exists(), "--plan must change nothing"


@pytest.mark.skipif(not system_python_is_externally_managed(), reason="needs an externally managed /usr/bin/python3")
def test_python_set_to_an_externally_managed_interpreter_is_refused_in_one_line(tmp_path):
    """$PYTHON is the user's choice: set-up does not replace it by a virtual environment; it stops, in one line."""
    done = plan(tree(tmp_path), clean_env("/usr/bin:/bin", PYTHON=str(SYSTEM_PYTHON)))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "PYTHON" in done.stderr, done.stderr


@pytest.mark.skipif(not system_python_is_externally_managed(), reason="needs an externally managed /usr/bin/python3")
@pytest.mark.parametrize("chosen", [{"PYTHON": "python3"}, {"VIRTUAL_ENV": "/usr"}], ids=["PYTHON=python3", "an env"])
def test_a_python_the_user_chose_is_never_swapped_for_a_virtual_environment(tmp_path, chosen):
    """PYTHON=python3 (a common export) or an active environment that refuses packages: set-up stops in one line,
    since the two commands would run the user's interpreter, not the .venv/ that set-up would fill."""
    done = plan(tree(tmp_path), clean_env("/usr/bin:/bin", **chosen))
    assert done.returncode == 2, done.stdout
    assert len(done.stderr.strip().splitlines()) == 1 and "refuses packages" in done.stderr, done.stderr


def test_a_python3_that_lacks_packages_is_never_installed_into(tmp_path):
    """A python3 that takes packages (not externally managed, with pip) but lacks some, and that nobody chose (no
    PYTHON, no active environment): set-up makes .venv/ and installs there, and says so in one line; it never installs
    into that python3 (on a fresh clone it once did, and uninstalled a pyenv Python's setuptools 65.5.0 and libcst
    1.0.1 on the way: other projects on that machine lost the versions they had)."""
    root = tree(tmp_path)
    base = sysconfig.get_config_var("BINDIR") + "/python3"  # the base interpreter: a venv of a venv is not made
    subprocess.run([base if Path(base).exists() else sys.executable, "-m", "venv", str(tmp_path / "bare")], check=True)
    bin_dir = wrapper(tmp_path / "bin" / "python3", str(tmp_path / "bare" / "bin" / "python")).parent
    done = plan(root, clean_env(f"{bin_dir}:/usr/bin:/bin"))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("setup:")]
    assert len(lines) == 1 and "lacks packages" in lines[0] and "into a virtual environment at .venv/" in lines[0], lines
    assert not (root / ".venv").exists(), "--plan must change nothing"


def test_an_earlier_virtual_environment_in_the_repository_is_used(tmp_path):
    """A .venv/ that an earlier set-up made (here: a stand-in running this interpreter, which has every package)."""
    root = tree(tmp_path)
    wrapper(root / ".venv/bin/python", sys.executable)
    done = plan(root, clean_env("/usr/bin:/bin"), "--test")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "setup: plan: .venv/bin/python has every package; nothing to install"


def test_an_active_virtual_environment_is_used_as_it_is(tmp_path):
    """VIRTUAL_ENV set: its python3 (first on PATH) is the one, even where a .venv/ exists."""
    root = tree(tmp_path)
    wrapper(root / ".venv/bin/python", "/nonexistent/python")
    bin_dir = tmp_path / "active" / "bin"
    wrapper(bin_dir / "python3", sys.executable)
    done = plan(root, clean_env(f"{bin_dir}:/usr/bin:/bin", VIRTUAL_ENV=str(bin_dir.parent)), "--test")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "setup: plan: python3 has every package; nothing to install"


def test_a_virtual_environment_left_without_pip_is_made_again(tmp_path):
    """A Ctrl-C during `python3 -m venv` can leave .venv/ without pip: set-up says so and makes it again."""
    root = tree(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True)
    done = plan(root, clean_env("/usr/bin:/bin"))
    assert done.returncode == 0, done.stderr
    assert "has no working pip" in done.stdout and "make it again" in done.stdout, done.stdout


def test_activate_makes_the_repository_s_virtual_environment_this_shell_s_python(tmp_path):
    """`. bench/activate.sh` from the repository's root: `python` is then .venv/bin/python."""
    root = tree(tmp_path)
    base = sysconfig.get_config_var("BINDIR") + "/python3"  # the base interpreter: a venv of a venv is not made
    subprocess.run([base if Path(base).exists() else sys.executable, "-m", "venv", "--without-pip", ".venv"],
                   cwd=root, check=True)
    done = subprocess.run(
        ["bash", "-c", ". bench/activate.sh && command -v python"],
        cwd=root, env=clean_env("/usr/bin:/bin"), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(root / ".venv/bin/python"), done.stdout


def test_the_two_commands_run_the_python_that_set_up_chose():
    """run_all.sh and tests/run.sh take their interpreter from bench/python.sh after set-up, not `python3` alone."""
    for script in ("run_all.sh", "tests/run.sh"):
        text = (REPO / script).read_text()
        assert ". bench/python.sh" in text and '"$(project_python)"' in text, script
        assert "${PYTHON:-python3}" not in text, script
