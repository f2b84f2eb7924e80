"""Grouped matrix multiplication (GMM) for mixture-of-experts layers (AXLearn's `megablock`)."""
