#!/usr/bin/env bash
# Builds the gateway's OCI image with no container registry and no container engine (what
# `make image` runs; docs/operations.md "The image"):
#
#   1. the project's wheel, built here with its C extensions by Debian's python3.11 (the
#      interpreter the image runs: same ABI), and the wheels of its runtime dependencies,
#      from PyPI;
#   2. a Debian bookworm root filesystem from Debian's packages (mmdebstrap, variant apt:
#      python3, ca-certificates and what they depend on), the wheels installed into the venv
#      /opt/nfsgw inside it (with no pip left in it), `nfsgw` on PATH;
#   3. that root filesystem as the one layer of an OCI image (Debian's umoci): labels, the
#      version tag from pyproject.toml, the git commit as its revision.
#
# Output, under $NFSGW_IMAGE_OUT (default build/image): oci/ (an OCI image layout, tag
# <version>) and nfsgw-<version>.oci.tar (the same layout as one archive: what
# `skopeo copy oci-archive:`, `podman load` and `ctr images import` read).
#
# As root, mmdebstrap builds in a chroot; as any other user it runs in unshare mode (user
# namespaces and /etc/subuid ranges needed; NFSGW_IMAGE_MODE overrides either). umoci
# never unpacks anything here: the layer is mmdebstrap's tarball, whose files are root's
# either way, so it needs no root.
#
# NFSGW_IMAGE_CACHE=DIR keeps the root filesystem's tarball there, keyed by a hash of
# pyproject.toml, the wheel's inputs (setup.py, the packages' sources) and this script: a
# rerun with none of them changed reuses it (the tests set it; `make image` does not, so it
# always takes Debian's current packages).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)
cd "$top"

out=${NFSGW_IMAGE_OUT:-build/image}
mkdir -p "$out"
out=$(cd "$out" && pwd)
suite=bookworm
mirror=${NFSGW_IMAGE_MIRROR:-http://deb.debian.org/debian}
# Debian bookworm's python3 is 3.11: the wheel is built by the same interpreter.
python=${NFSGW_IMAGE_PYTHON:-/usr/bin/python3.11}

say() { printf 'image: %s\n' "$*" >&2; }
need() { command -v "$1" >/dev/null || { say "$1 not found ($2)"; exit 1; }; }
need mmdebstrap "apt-get install mmdebstrap"
need umoci "apt-get install umoci"
need git "apt-get install git"
[ -x "$python" ] || { say "$python not found (apt-get install python3 python3-dev python3-venv)"; exit 1; }
"$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || { say "$python is not Python 3.11, the ABI of bookworm's python3"; exit 1; }

version=$("$python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
revision=$(git rev-parse HEAD)
git diff --quiet HEAD -- 2>/dev/null || revision="$revision-dirty"
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

if [ -n "${NFSGW_IMAGE_MODE:-}" ]; then
  mode=$NFSGW_IMAGE_MODE
elif [ "$(id -u)" = 0 ]; then
  mode=root
else
  mode=unshare
fi

# The wheel's inputs: what git tracks (and its working-tree content), no build leftovers.
mapfile -d '' sources < <(git ls-files -z -- pyproject.toml setup.py LICENSE README.md \
  gateway nfsproto loadgen)
key=$( { sha256sum "$here/build.sh"; sha256sum "${sources[@]}"; echo "$mirror $suite"; } \
  | sha256sum | cut -c1-16)

rootfs_tar=
if [ -n "${NFSGW_IMAGE_CACHE:-}" ]; then
  mkdir -p "$NFSGW_IMAGE_CACHE"
  rootfs_tar=$NFSGW_IMAGE_CACHE/rootfs-$version-$key.tar
  if [ -s "$rootfs_tar" ]; then
    say "root filesystem from the cache: $rootfs_tar"
  fi
else
  rootfs_tar=$out/rootfs.tar
  rm -f "$rootfs_tar"
fi

if [ ! -s "$rootfs_tar" ]; then
  work=$out/work
  rm -rf "$work"
  mkdir -p "$work/src" "$work/wheels"
  # 1. The wheels. From a copy of the tracked files: setuptools' build/ in the tree could
  # hold modules that no longer exist.
  git ls-files -z -- "${sources[@]}" | xargs -0 cp --parents -t "$work/src"
  say "building the wheel and its dependencies' wheels ($python)"
  "$python" -m pip wheel --quiet --no-cache-dir --wheel-dir "$work/wheels" "$work/src" pip
  wheel=$(ls "$work"/wheels/nfsgw-"$version"-*.whl)
  case $wheel in
    *-cp311-cp311-linux_*.whl) ;;
    *) say "$wheel: not a CPython 3.11 binary wheel (were the C extensions built?)"; exit 1;;
  esac
  "$python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for mod in ("_fastwire", "_checksums", "_s3list"):
    if not any(n.startswith(f"gateway/{mod}.cpython-311-") and n.endswith(".so") for n in names):
        sys.exit(f"image: {sys.argv[1]} has no gateway/{mod}*.so: the C extension was not built")
print("image: the wheel holds the three C extensions", file=sys.stderr)
PY
  pipwhl=$(basename "$(ls "$work"/wheels/pip-*.whl)")

  # 2. The root filesystem. /usr is merged by mmdebstrap's hook (usr-is-merged), not by the
  # usrmerge package (which would bring perl: ~50 MB). Documentation, manual pages and translations are never
  # unpacked (copyright files are kept); apt's lists and caches go (mmdebstrap's cleanup).
  say "building the $suite root filesystem (mmdebstrap --mode=$mode)"
  mmdebstrap --mode="$mode" --variant=apt --format=tar \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --include=python3,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --customize-hook="copy-in $work/wheels /tmp" \
    --customize-hook='chroot "$1" python3 -m venv --without-pip /opt/nfsgw' \
    --customize-hook="chroot \"\$1\" /opt/nfsgw/bin/python /tmp/wheels/$pipwhl/pip install \
      --isolated --quiet --no-index --no-cache-dir --find-links /tmp/wheels nfsgw==$version" \
    --customize-hook='chroot "$1" /opt/nfsgw/bin/nfsgw --version' \
    --customize-hook='rm -rf "$1"/tmp/wheels' \
    --customize-hook='ln -s /opt/nfsgw/bin/nfsgw "$1"/usr/local/bin/nfsgw' \
    --customize-hook='mkdir -p "$1"/etc/nfsgw "$1"/var/lib/nfsgw "$1"/var/cache/nfsgw' \
    --customize-hook='rm -rf "$1"/var/log/* "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old' \
    "$suite" "$rootfs_tar.part" "$mirror"
  mv "$rootfs_tar.part" "$rootfs_tar"
  rm -rf "$work"
fi

# 3. The OCI image: one layer (the root filesystem), then its configuration.
layout=$out/oci
img=$layout:$version
say "assembling $img (umoci)"
rm -rf "$layout"
umoci init --layout "$layout"
umoci new --image "$img"
umoci raw add-layer --image "$img" \
  --history.created "$created" --history.created_by "deploy/image/build.sh (mmdebstrap $suite)" \
  "$rootfs_tar"
labels=(
  "org.opencontainers.image.title=nfsgw"
  "org.opencontainers.image.description=User-space NFSv3 gateway in front of S3-compatible object storage"
  "org.opencontainers.image.version=$version"
  "org.opencontainers.image.revision=$revision"
  "org.opencontainers.image.source=$(git config --get remote.origin.url || echo unknown)"
  "org.opencontainers.image.licenses=Apache-2.0"
  "org.opencontainers.image.created=$created"
  "org.opencontainers.image.base.name=debian:$suite"
)
cfg=(--image "$img" --os linux --architecture amd64 --created "$created"
  --author "nfsgw" --no-history
  --config.user 0:0 --config.workingdir /
  --clear=config.env
  --config.env PATH=/opt/nfsgw/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  --config.env PYTHONDONTWRITEBYTECODE=1
  --config.env LANG=C.UTF-8
  --clear=config.entrypoint --config.entrypoint nfsgw
  --clear=config.cmd --config.cmd serve --config.cmd --config=/etc/nfsgw/nfsgw.toml
  --config.exposedports 2049/tcp
  --config.volume /var/lib/nfsgw --config.volume /var/cache/nfsgw)
for l in "${labels[@]}"; do cfg+=(--config.label "$l" --manifest.annotation "$l"); done
umoci config "${cfg[@]}"
umoci gc --layout "$layout"

# containerd (`ctr images import`) names an image by this annotation of index.json; the
# OCI ref.name holds the tag.
"$python" - "$layout/index.json" "localhost/nfsgw:$version" <<'PY'
import json, sys
path, name = sys.argv[1], sys.argv[2]
index = json.load(open(path))
for m in index["manifests"]:
    m.setdefault("annotations", {})["io.containerd.image.name"] = name
json.dump(index, open(path, "w"), separators=(",", ":"))
PY

archive=$out/nfsgw-$version.oci.tar
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -C "$layout" -cf "$archive.part" oci-layout index.json blobs
mv "$archive.part" "$archive"
unpacked=$(du -h --apparent-size "$rootfs_tar" | cut -f1)
[ -n "${NFSGW_IMAGE_CACHE:-}" ] || rm -f "$rootfs_tar"
say "built $img, revision $revision: $(du -h --apparent-size "$archive" | cut -f1) \
(gzipped layer; $unpacked unpacked) in $archive"
echo "$archive"
