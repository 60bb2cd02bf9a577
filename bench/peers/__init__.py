"""Peers measured against mstar on the same weights, prompts and thread counts."""
