# Sourced by the GPU scripts (scripts/gpu_tests.sh, bench/holdout_tables.sh) from the
# checkout's root, with PY set to the Python to use.
#
#   need_packages 'import optuna, scipy'
#
# When the imports fail and a .whl folder is here (wheels carried to a machine with no
# network), installs those wheels into /tmp/site and puts it on PYTHONPATH; then the imports
# must succeed, else the script exits with status 2.
need_packages() {
  if ! "$PY" -c "$1" 2>/dev/null && [ -d .whl ]; then
    echo "installing the carried wheels (.whl) into /tmp/site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 2
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  "$PY" -c "$1" || { echo "missing packages (see the comment at the top)"; exit 2; }
}
