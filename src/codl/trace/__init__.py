"""The instrument: one CLOCK_MONOTONIC timeline, recorders per level, and the HDF5 trace store.

The harness imports the recorders from here (it is the instrumented program); nothing in this
package imports the harness, so a trace can be read, checked and exported without torch.
"""
