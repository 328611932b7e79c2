"""arcsim: which gradient compressor, collective and ratio train fastest on a given cluster."""

__version__ = "0.1.0"
