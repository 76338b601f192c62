"""Operator fuzzing: the harness, Hypothesis strategies, the op suite and Triton cross-compilation."""
