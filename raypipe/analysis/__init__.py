"""Trajectory analysis (the seed paper's RQ-1): statistics, bootstrap intervals, plots and the HTML report."""
