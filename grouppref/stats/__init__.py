"""Aggregation numerics as pure tensor functions, one algorithm per module (Bradley-Terry
fit, rank statistics, noise, reliability)."""
