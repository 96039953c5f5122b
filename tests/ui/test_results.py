"""Result files opened in the dashboard: checked at the boundary, one line per error."""

from __future__ import annotations

import pytest

from plinth.control.ui.results import fl_view, sim_view
from plinth.core.errors import SpecError

ROW = {"policy": "fifo", "jobs": 3, "avg_jct_s": 7200.0, "gpu_utilization": 0.5}


@pytest.mark.parametrize("data, message", [
    ({"policy": "fifo"}, "sim results: expected a non-empty list of result rows"),
    ([], "sim results: expected a non-empty list"),
    ([{"jobs": 3}], "policy"),
    ([{**ROW, "jobs": "many"}], "jobs"),
    ([{**ROW, "series": {"jct_s": [1.0]}}], "series"),
])
def test_bad_sim_results_are_one_line(data, message) -> None:
    with pytest.raises(SpecError, match=message) as e:
        sim_view(data)
    assert "\n" not in str(e.value)


def test_sim_results_without_series_show_the_table_only() -> None:
    view = sim_view([ROW])
    assert view["missing_series"] and view["plots"] == []
    assert "fifo" in view["table"] and "2.00" in view["table"]  # avg JCT in hours, as the CLI


def test_bad_fl_results_are_one_line() -> None:
    with pytest.raises(SpecError, match="rounds") as e:
        fl_view({"app": "a", "strategy": "fedavg"})
    assert "\n" not in str(e.value)
    with pytest.raises(SpecError, match="fl results"):
        fl_view([1, 2])
