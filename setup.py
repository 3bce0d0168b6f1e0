"""The one thing pyproject.toml cannot say: the ahead-of-time compiled fragmentation kernel.

``scheduler/core/_fragkernel.c`` is built where a C compiler and Python's headers exist and is
optional: without them the install still succeeds (setuptools warns) and gpufrag uses the
numba kernel, or the numpy form (``scheduler/core/fragkernel.py`` says which and why).
``-ffp-contract=off`` keeps every product and sum rounded on its own, as the numpy form does.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "scheduler.core._fragkernel", sources=["scheduler/core/_fragkernel.c"], optional=True,
    extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math"],
)])
