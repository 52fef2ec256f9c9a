# Makes `python` in this shell the Python that set-up installed into; source it from the repository's root:
#   . bench/activate.sh
# .venv/ (made by set-up where the system's Python refuses packages, PEP 668) is activated unless a virtual environment
# or conda is already active; where no `python` command exists (Debian's python3 only), `python` runs $PYTHON or
# python3. Elsewhere it changes nothing. Run rather than sourced, or sourced from another folder, it says so and does
# nothing.
if [ -n "${BASH_VERSION:-}" ] && [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "activate: source it (. bench/activate.sh): run as a command it cannot change your shell" >&2
  exit 2
elif [ ! -f bench/python.sh ]; then
  echo "activate: source it from the repository's root: cd to the folder that holds bench/, then . bench/activate.sh" >&2
  return 2
elif [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}${PYTHON:-}" ] && [ -f .venv/bin/activate ]; then
  . .venv/bin/activate
  echo "activate: python is .venv/bin/python (leave it with: deactivate)"
elif [ -n "${PYTHON:-}" ] || ! command -v python >/dev/null 2>&1; then
  python() { "${PYTHON:-python3}" "$@"; }
  echo "activate: python runs ${PYTHON:-python3}"
fi
