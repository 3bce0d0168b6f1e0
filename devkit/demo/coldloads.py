"""Cold loads: replica placements counted as warm or cold by what each node already ran (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field

ModelKey = tuple[str, str]  # (model, version)


@dataclass
class ColdLoads:
    """Replica placements, in bind order, split into warm (the node already ran that model
    version: image pulled, weights in the page cache) and cold. ``ran`` is what each node has
    run so far and carries over from one phase to the next."""

    ran: set[tuple[str, str, str]] = field(default_factory=set)  # (node, model, version)
    placements: int = 0
    avoided: int = 0

    def place(self, node: str, key: ModelKey) -> bool:
        """Count one placement; True when it was warm."""
        entry = (node, *key)
        warm = entry in self.ran
        self.ran.add(entry)
        self.placements += 1
        self.avoided += warm
        return warm

    def phase(self) -> ColdLoads:
        """A fresh count that remembers what already ran."""
        return ColdLoads(ran=set(self.ran))

    def as_dict(self) -> dict[str, int]:
        return {"placements": self.placements, "cold_loads_avoided": self.avoided,
                "cold_loads": self.placements - self.avoided}
