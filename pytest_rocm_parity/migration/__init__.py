"""Migration tools: backend facts, the doctor and its ROCm tools, the compatibility matrix, the scanner."""
