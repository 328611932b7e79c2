"""The parallel strategy layer, between run/ (measure, decide, report) and pricing (collectives on links).

A strategy turns a model's layers, its compute and a topology into one step's work for the timeline engine
(:mod:`.engine`): stretches of compute and compression on the compute lane, and collectives on the links of their
group (``node``, ``inter``, or both for the world), each waiting for what it must. Every strategy runs on that one
engine, with the cluster's effects (:mod:`.effects`: the slowest rank, jitter, interference) applied there alone.

- **DDP and Horovod** (:mod:`.data_parallel`, groups from :mod:`.frameworks` and :mod:`.buckets`): each bucket or
  fusion buffer compressed once ready and sent on one collective stream; its collectives are the gradients a
  compressor replaces (arcsim run measures the compressors on exactly these groups).
- **FSDP2, HSDP, ZeRO++** (:mod:`.sharded`, the schedule in :mod:`.schedule`, units in :mod:`.units`, memory per GPU in
  :mod:`.memory`): per unit all-gathers of parameters and reduce-scatters of gradients; HSDP's cross-node all-reduce
  of each shard is the collective a compressor replaces (arcsim run --sharding hybrid, with the node-aware
  measurement's collectives and error), ZeRO++'s formats quantise the rest.
"""
