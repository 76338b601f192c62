"""Running models: the check spec and hooks, module selection, capture, replay, training parity, the statistics kernels."""
