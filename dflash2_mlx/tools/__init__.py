"""Tools built on the library: bench, compare, doctor, analyze, cycle profiler, synthetic checkpoints."""
