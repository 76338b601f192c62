"""Causal-LM parity on top of the runner: perplexity, token agreement, KL, generation."""
