"""The named columns of the judging rule: the per-block sums a device computes (Stat) and the
metrics the host derives from them (Metric). Apart from compare.py so that the statistics kernels
(runner.kernels) can name them without importing the rule."""
from __future__ import annotations

from enum import IntEnum


class Stat(IntEnum):
    """Columns of the per-block statistics (block_stats), with t = r + e the float64 truth.

    The device computes only these (kernels.block_stats_torch, triton_stats.stats_many_kernel);
    every judging formula runs on the host from them (metric_columns). All are sums over the
    block except MAX_ABS_DIFF, a maximum, which is kept last so that ``st[..., :MAX_ABS_DIFF]``
    are the summed columns.
    """

    CAND_ERR2 = 0       # sum (c - t)^2
    REF_ERR2 = 1        # sum (r - t)^2 = sum e^2
    TRUTH2 = 2          # sum t^2
    REF2 = 3            # sum r^2
    DIFF2 = 4           # sum (c - r)^2
    CAND_FARTHER = 5    # count of |c - t| > |r - t|
    CAND_CLOSER = 6     # count of |c - t| < |r - t|
    MAX_ABS_DIFF = 7    # max |c - r|


class Metric(IntEnum):
    """Columns of metric_columns, named and ordered as LeafMetrics' fields (metrics_from_columns
    passes a row positionally)."""

    ERR_CAND = 0
    ERR_REF = 1
    RMS_TRUTH = 2
    RATIO = 3
    RATIO_LO = 4
    Z = 5
    REL_TO_REF = 6
    MAX_ABS_TO_REF = 7
