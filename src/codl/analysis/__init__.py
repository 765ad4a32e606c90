"""Traces -> tables (pure: DataFrames in, DataFrames out) -> figures (plots.py only draws)."""
