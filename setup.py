"""The compiled part of the build: ``gateway._fastwire``, the fast path's wire mechanics in C
(pyproject.toml holds the project's metadata and everything else).

``optional=True``: where the extension cannot be built (no C compiler, no Python headers) the
install still succeeds, and the gateway serves with the pure-Python twin
(``gateway/fastwire.py``), which gives the same bytes at a higher CPU cost. An editable
install (``pip install -e .``, what ``make venv`` runs) builds the module in place, next to
its source.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gateway._fastwire",
            ["gateway/_fastwire.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror", "-std=c11"],
            optional=True,
        )
    ]
)
