#!/usr/bin/env bash
# Sets up Harbor's own `-e podman` environment on a Debian bookworm machine, as root, with no
# image registry: Debian's podman; a Python 3.12 venv with evals/requirements.txt (Harbor and
# podman-compose); a containers.conf whose ulimits fit this machine; and a bookworm base image
# made with debootstrap, imported under the name the tasks' Dockerfiles `FROM`.
# Idempotent: each step is skipped when its result is there (the base image is cached as a tar).
# Then:  . "$HARBOR_HOME/env"   puts harbor on PATH, with CONTAINERS_CONF, the cost-map flag and
#                                telemetry off.
#   HARBOR_HOME   where it all lives (default /var/cache/agentpy-harbor)
#   HARBOR_PYTHON the 3.12+ interpreter (default: pyenv's 3.12.1 through python3.12, else python3.12)
set -euo pipefail
EVALS=$(cd "$(dirname "$0")" && pwd)
HOME_DIR=${HARBOR_HOME:-/var/cache/agentpy-harbor}
BASE_IMAGE=docker.io/library/debian:bookworm-slim   # what evals/tasks/*/environment/Dockerfile FROM
say() { printf 'setup-podman: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (apt-get, podman as root, debootstrap)"
mkdir -p "$HOME_DIR"

# 1. Debian packages.
need=()
for cmd_pkg in podman:podman runc:runc iptables:iptables debootstrap:debootstrap; do
  command -v "${cmd_pkg%%:*}" >/dev/null 2>&1 || need+=("${cmd_pkg#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  say "apt-get install ${need[*]}"
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "${need[@]}" uidmap slirp4netns fuse-overlayfs >&2
fi

# 2. The Python 3.12 venv with the pinned Harbor.
if [ -z "${HARBOR_PYTHON:-}" ]; then
  if PYENV_VERSION=3.12.1 python3.12 -c '' 2>/dev/null; then
    HARBOR_PYTHON=$(PYENV_VERSION=3.12.1 python3.12 -c 'import sys; print(sys.executable)')
  elif python3.12 -c '' 2>/dev/null; then
    HARBOR_PYTHON=$(python3.12 -c 'import sys; print(sys.executable)')
  else
    die "no Python 3.12 (Harbor needs 3.12 or newer): set HARBOR_PYTHON"
  fi
fi
VENV=$HOME_DIR/venv
stamp=$VENV/.requirements
if ! cmp -s "$EVALS/requirements.txt" "$stamp" 2>/dev/null; then
  say "venv $VENV with $(cat "$EVALS/requirements.txt" | grep -v '^#' | tr '\n' ' ')"
  "$HARBOR_PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$EVALS/requirements.txt" >&2
  cp "$EVALS/requirements.txt" "$stamp"
fi

# 3. containers.conf: podman as root asks for ulimits this VM cannot grant; ask for what it has.
# crun refuses this machine's cgroup v1 hierarchy ("cgroups in hybrid mode not supported"): runc;
# no systemd runs here: cgroupfs.
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
[ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
cat > "$HOME_DIR/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
export CONTAINERS_CONF="$HOME_DIR/containers.conf"

# 4. The base image: bookworm minbase with Python 3.11, imported under the tasks' FROM name.
if ! podman image exists "$BASE_IMAGE"; then
  tarball=$HOME_DIR/bookworm-base.tar
  if [ ! -s "$tarball" ]; then
    root=$HOME_DIR/rootfs
    rm -rf "$root"
    say "debootstrap bookworm into $root (a few minutes)"
    # The mirror this machine's apt uses (deb822 sources, else a one-line sources.list).
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    [ -n "$mirror" ] || { echo "setup-podman.sh: no Debian mirror in this machine's apt sources" >&2; exit 1; }
    debootstrap --variant=minbase \
        --include=python3,python3-venv,python3-pip,ca-certificates,curl \
        bookworm "$root" "$mirror" >&2
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  say "podman import $BASE_IMAGE"
  podman import "$tarball" "$BASE_IMAGE" >&2
fi

# 5. Wheels of agent.py's packages for the base image's Python, so that the tests' trials install
# agent.py with pip offline (tests/test_harbor.py mounts them; a user's trials use PyPI).
if ! cmp -s "$EVALS/../requirements.txt" "$HOME_DIR/wheels/.requirements" 2>/dev/null; then
  say "wheels of requirements.txt for the base image's python3 in $HOME_DIR/wheels"
  rm -rf "$HOME_DIR/wheels" && mkdir -p "$HOME_DIR/wheels"
  podman run --rm -v "$EVALS/../requirements.txt:/requirements.txt:ro" \
      -v "$HOME_DIR/wheels:/wheels" "$BASE_IMAGE" \
      python3 -m pip download -q --disable-pip-version-check -r /requirements.txt -d /wheels >&2
  cp "$EVALS/../requirements.txt" "$HOME_DIR/wheels/.requirements"
fi

# HARBOR_TELEMETRY=0: Harbor sends usage events to its makers unless told not to.
cat > "$HOME_DIR/env" <<ENV
export PATH="$VENV/bin:\$PATH"
export CONTAINERS_CONF="$HOME_DIR/containers.conf"
export LITELLM_LOCAL_MODEL_COST_MAP=True
export HARBOR_TELEMETRY=0
ENV
say "ready: . $HOME_DIR/env"
echo "$HOME_DIR"
