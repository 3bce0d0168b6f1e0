"""Go tools of the dev kit (promtool, helm, test harnesses), built from their modules on demand.

Each lives in ``devkit/tools/<name>/`` (a ``go.mod`` pinning the upstream module and a main
package) and is built once into a cache outside the repository by ``devkit/tools/build``.
Tests ask for a tool through :func:`build_tool`; a failed build raises :class:`BuildError`
with the build's output, so a test that needs the tool fails rather than silently skipping.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Final

from devkit.build import BuildError

TOOLS_DIR: Final = Path(__file__).resolve().parent / "tools"
BUILD_TIMEOUT_S: Final = 3600.0


def build_tool(name: str) -> Path:
    """The path of the built tool ``name`` (cached after the first build)."""
    result = subprocess.run([str(TOOLS_DIR / "build"), name], capture_output=True, text=True,
                            timeout=BUILD_TIMEOUT_S, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise BuildError(f"building {name} failed (exit {result.returncode}):\n"
                         f"{result.stderr[-4000:]}")
    return Path(lines[-1])
