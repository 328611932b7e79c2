"""Time-to-accuracy: real data-parallel training through each compressor, priced on a topology."""
