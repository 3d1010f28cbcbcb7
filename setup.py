"""The compiled part of the build: ``gateway._fastwire``, the fast path's wire mechanics in C,
``gateway._checksums``, the CRCs S3 stores, and ``gateway._s3list``, ListObjectsV2 pages
(pyproject.toml holds the project's metadata and everything else).

``optional=True``: where the extension cannot be built (no C compiler, no Python headers) the
install still succeeds, and the gateway serves with the pure-Python twins
(``gateway/fastwire.py``, ``gateway/backend/checksums.py``, ``gateway/backend/s3wire.py``),
which give the same bytes at a higher CPU cost -- except that without ``gateway._checksums``
stored CRC64NVME and CRC32C checksums are no longer verified (unless ``verify_crc32c``): the
install says so for each module it could not build (``LOST``), and so does the gateway at
start. An editable install (``pip install -e .``, what ``make venv`` runs) builds the modules
in place, next to their sources.
"""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-std=c11"]
# What the gateway loses without each module (tests/unit/test_setup.py checks the message).
LOST = {
    "gateway._fastwire": "the fast path, record reader and disk-tier mappings run in Python "
    "(the same bytes, more CPU per call)",
    "gateway._checksums": "stored CRC64NVME and CRC32C checksums will NOT be verified on "
    "whole-object reads (most objects Amazon S3 holds carry only a CRC64NVME; stored CRC32, "
    "SHA-1 and SHA-256 ones still are), unless [s3] verify_crc32c = true verifies them in "
    "Python at ~7 ms of CPU per 110 kB",
    "gateway._s3list": "listing pages are parsed in Python (more CPU per page)",
}


class BuildExt(build_ext):
    """``build_ext`` that says what is lost when an optional module fails to build."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception:
            if ext.optional:
                sys.stderr.write(
                    f"WARNING: nfsgw: {ext.name} was not built (no C compiler or Python "
                    f"headers?): {LOST.get(ext.name, 'it runs in Python')}. Install a C "
                    "compiler and reinstall to build it.\n"
                )
            raise


if __name__ == "__main__":  # how pip's build backend runs it; tests import it
    setup(
        cmdclass={"build_ext": BuildExt},
        ext_modules=[
            Extension(
                "gateway._fastwire",
                ["gateway/_fastwire.c"],
                extra_compile_args=FLAGS,
                optional=True,
            ),
            Extension(
                "gateway._checksums",
                ["gateway/_checksums.c"],
                extra_compile_args=FLAGS,
                optional=True,
            ),
            Extension(
                "gateway._s3list", ["gateway/_s3list.c"], extra_compile_args=FLAGS, optional=True
            ),
        ],
    )
