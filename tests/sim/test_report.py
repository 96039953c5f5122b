"""The utilisation plot's binning keeps the time-weighted mean of the step function."""

import numpy as np

from plinth.sim.report import _downsample, table


def test_binned_mean_counts_an_interval_in_every_bin_it_spans():
    t, v = np.array([0.0, 10.0, 100.0]), np.array([4.0, 1.0, 0.0])
    edges, mean = _downsample(t, v, 10)
    assert mean.tolist() == [4.0] + [1.0] * 9
    # The integral over the whole run is preserved: 4*10 + 1*90.
    assert np.sum(mean * np.diff(np.append(edges, 100.0))) == 130.0


def test_table_skips_columns_no_row_has():
    rows = [{"policy": "fifo", "jobs": 3, "avg_jct_s": 7200.0}]
    t = table(rows)
    headers = [c.header for c in t.columns]
    assert headers == ["policy", "jobs", "avg JCT (h)"]
