"""The instrumented program: components (data, compute, comm), modes, workloads and launch."""
