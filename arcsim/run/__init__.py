"""`arcsim run`: per-compressor iteration time on a topology, the switching policy, and the ratio trade-off."""
