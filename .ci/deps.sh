# Installs what the demo and the tests need when it is missing (Debian/Ubuntu, apt-get).
# Sourced by examples/demo.sh and tests/all.sh; set REDLEASE_DEPS to the groups wanted.
need_pkgs=()
want() { command -v "$1" >/dev/null 2>&1 || need_pkgs+=("$2"); }

want redis-server redis-server
for group in ${REDLEASE_DEPS:-}; do
  case "$group" in
    tls) want openssl openssl ;;
    c) want cc gcc; want c++ g++; want valgrind valgrind
       # scripts/install.sh and tests/install_check.sh: readelf and strip, pkg-config.
       want readelf binutils; want strip binutils; want pkg-config pkg-config
       want redis-cli redis-tools ;;
    python) want python3 python3
            python3 -m venv --help >/dev/null 2>&1 || need_pkgs+=(python3-venv) ;;
  esac
done

if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "installing: ${need_pkgs[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "please install: ${need_pkgs[*]}" >&2
    exit 1
  fi
  $sudo apt-get update -qq && $sudo apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
