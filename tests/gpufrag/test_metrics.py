"""No component exports ``_created`` families (gpufrag.metrics is their one registry maker)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter: the switch is process-wide, so an earlier test cannot hide a
# registry made without it.
SCRIPT = """
from prometheus_client import generate_latest
from defrag.admission.review import AdmissionMetrics
from defrag.controller.metrics import CycleMetrics
from node.agent.metrics import AgentMetrics
from serving.metrics import ServingMetrics
pages = []
for metrics in (AdmissionMetrics(), CycleMetrics(dry_run=True), AgentMetrics("n0"),
                ServingMetrics(model="m")):
    pages.append(generate_latest(metrics.registry).decode())
text = "\\n".join(pages)
assert "_total" in text and "_bucket" in text, text[:2000]
created = sorted({line.split("{")[0].split(" ")[0] for line in text.splitlines()
                  if "_created" in line and not line.startswith("#")})
print(",".join(created))
"""


def test_no_component_exports_created_families() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "", f"_created families: {done.stdout.strip()}"
