"""Reports: HTML, CSV, the terminal summary, golden inspection (show/diff), profiler parity."""
