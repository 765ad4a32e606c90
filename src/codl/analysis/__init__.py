"""Traces -> tables, pure (DataFrames in, DataFrames out): reduce a trace (``summarize``,
``chunked``, ``calls``, ``offcpu``, ``decompose``' parts) and compare runs with their isolation
twins (``compare``, ``decompose``, ``steady``). Shared names live in ``columns`` at the bottom."""
