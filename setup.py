"""The compiled part of the build: ``gateway._fastwire``, the fast path's wire mechanics in C,
``gateway._checksums``, the CRCs S3 stores, and ``gateway._s3list``, ListObjectsV2 pages
(pyproject.toml holds the project's metadata and everything else).

``optional=True``: where the extension cannot be built (no C compiler, no Python headers) the
install still succeeds, and the gateway serves with the pure-Python twins
(``gateway/fastwire.py``, ``gateway/backend/checksums.py``, ``gateway/backend/s3wire.py``),
which give the same results at a higher CPU cost. An editable install (``pip install -e .``,
what ``make venv`` runs) builds the modules in place, next to their sources.
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-std=c11"]

setup(
    ext_modules=[
        Extension(
            "gateway._fastwire", ["gateway/_fastwire.c"], extra_compile_args=FLAGS, optional=True
        ),
        Extension(
            "gateway._checksums", ["gateway/_checksums.c"], extra_compile_args=FLAGS, optional=True
        ),
        Extension(
            "gateway._s3list", ["gateway/_s3list.c"], extra_compile_args=FLAGS, optional=True
        ),
    ]
)
