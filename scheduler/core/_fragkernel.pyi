# The C engine of scheduler/core/fragkernel.py (_fragkernel.c); present where it was compiled.
from typing import Any

def frag_rows(free: Any, cpu_left: Any, product: Any, thresholds: Any, threshold_of: Any,
              cpu_milli: Any, num_gpu: Any, gpu_milli: Any, popularity: Any, allowed: Any,
              constrained: bool, out: Any, /) -> None: ...
def frag_before_after(free: Any, cpu_left: Any, product: Any, thresholds: Any,
                      threshold_of: Any, cpu_milli: Any, num_gpu: Any, gpu_milli: Any,
                      popularity: Any, allowed: Any, constrained: bool, take_milli: int,
                      take_cpu: int, whole_gpus: int, full: int, out: Any, /) -> None: ...
