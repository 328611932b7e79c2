"""What-if sweeps: spec, point evaluation, resumable results, charts."""
