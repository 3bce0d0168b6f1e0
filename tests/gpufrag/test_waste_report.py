"""gpufrag/waste_report.py: the three figures a user reads at the end, known or not."""

from __future__ import annotations

from gpufrag.waste_report import Figure, WasteOutcome


def test_known_figures_read_as_numbers_and_bounds_say_at_least() -> None:
    outcome = WasteOutcome(gpu_hours_given_back=Figure(135_412.34),
                           free_whole_gpus_gained=Figure(412.0, "against the baseline"),
                           evictions=Figure(3, "workloads moved", at_least=True))
    assert outcome.lines() == [
        "GPU-hours given back:   135,412.3",
        "free whole GPUs gained: +412 (against the baseline)",
        "evictions it cost:      at least 3 (workloads moved)"]


def test_a_figure_the_records_do_not_hold_says_so_and_why() -> None:
    figure = Figure.unknown("no earlier figure is kept")
    assert figure.text(",.0f") == "not recorded (no earlier figure is kept)"
    assert figure.as_dict() == {"value": None, "at_least": False,
                                "detail": "no earlier figure is kept"}
