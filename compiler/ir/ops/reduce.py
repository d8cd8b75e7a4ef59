"""Reductions over axes (sum, mean, max...) and log-softmax."""

from __future__ import annotations
