"""Gradient traces: format, capture, compute profiles, statistics."""
