"""Real runs to check predictions against: the emulated cluster (namespaces, shaping, delay), the
collective microbenchmark and calibration, DDP training, and validation with its torchrun worker."""

# Modules run as `python -m …` in other processes: their names, from one place (tests import each).
VALIDATE_WORKER = "arcsim.testbed.validate_worker"
DELAY_FORWARDER = "arcsim.testbed.delay_forwarder"
MICROBENCH = "arcsim.testbed.microbench"
