# Which Python the project runs: sourced by bench/setup.sh, run_all.sh and tests/run.sh (not run on its own).
#   project_python   prints the interpreter: $PYTHON when set; the active environment's python3 when a virtual
#                    environment or conda is active; else .venv/bin/python when set-up made one (a python3 that
#                    refused packages, PEP 668, or lacked them: set-up installs into no Python it did not make or
#                    was not given); else python3 (one that imports every package already).
#   refuses_packages INTERPRETER   succeeds when pip cannot install into it: externally managed (PEP 668: an
#                    EXTERNALLY-MANAGED file in its stdlib, outside a virtual environment) or without pip.
# It changes nothing in the shell that sources it but these two functions.

project_python() {
  if [ -n "${PYTHON:-}" ]; then
    echo "$PYTHON"
  elif [ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]; then
    echo python3
  elif [ -x .venv/bin/python ]; then
    echo .venv/bin/python
  else
    echo python3
  fi
}

refuses_packages() {
  "$1" - <<'PY' 2>/dev/null
import os, sys, sysconfig
managed = sys.prefix == sys.base_prefix and os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
managed = managed and not os.environ.get("PIP_BREAK_SYSTEM_PACKAGES")  # the user's own override of PEP 668
sys.exit(0 if managed else 1)
PY
  [ $? -eq 0 ] && return 0
  "$1" -m pip --version >/dev/null 2>&1 && return 1  # a pip that runs (one that only imports may be half installed)
  return 0
}
