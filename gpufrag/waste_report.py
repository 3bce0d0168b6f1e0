"""What the waste loop gave back and what it cost, in the words a user reads at the end.

Three figures answer "was it worth it?" (issue 43): GPU-hours given back, free whole GPUs
gained, and the evictions they cost. The what-if (``gpufrag whatif --defrag``) knows all three
exactly; a live cluster (``gpufrag inspect --summary``) knows only what its objects still
record, so a figure may be a lower bound ("at least") or not derivable at all. One home for
their wording, so both commands say the same thing the same way, and so a figure the cluster
does not record is printed as such, with why, instead of a number made up to fill the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

NOT_RECORDED: Final = "not recorded"


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure: its value, or None and why it is not known; ``at_least`` when what was
    recorded covers only part of the story (a lower bound); ``detail`` says what it counts."""

    value: float | None
    detail: str = ""
    at_least: bool = False

    @classmethod
    def unknown(cls, why: str) -> Figure:
        return cls(None, why)

    def text(self, fmt: str) -> str:
        if self.value is None:
            return f"{NOT_RECORDED} ({self.detail})" if self.detail else NOT_RECORDED
        value = format(self.value, fmt)
        shown = f"at least {value}" if self.at_least else value
        return f"{shown} ({self.detail})" if self.detail else shown

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "at_least": self.at_least, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class WasteOutcome:
    """The three figures of one run (simulated) or one cluster (live)."""

    gpu_hours_given_back: Figure
    free_whole_gpus_gained: Figure
    evictions: Figure

    def lines(self) -> list[str]:
        """One line a figure, aligned, for the end of a report."""
        return [f"GPU-hours given back:   {self.gpu_hours_given_back.text(',.1f')}",
                f"free whole GPUs gained: {self.free_whole_gpus_gained.text('+,.0f')}",
                f"evictions it cost:      {self.evictions.text(',.0f')}"]

    def as_dict(self) -> dict[str, Any]:
        return {"gpu_hours_given_back": self.gpu_hours_given_back.as_dict(),
                "free_whole_gpus_gained": self.free_whole_gpus_gained.as_dict(),
                "evictions": self.evictions.as_dict()}
