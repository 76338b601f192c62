"""How a layer is judged: the tolerance policy, the per-leaf statistics, verdicts, records and the failure message."""
