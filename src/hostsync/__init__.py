"""Reproduce, fix and review hidden host synchronizations in PyTorch training code."""
