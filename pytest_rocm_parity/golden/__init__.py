"""Goldens on disk: the store (safetensors + manifest, atomic commits, validated reads), artifact stores, derived and sketch goldens."""
