"""Trajectory analysis (the seed paper's RQ-1): statistics, bootstrap intervals, paired tests, plots, the HTML
report, run comparisons and experiment tracking."""
