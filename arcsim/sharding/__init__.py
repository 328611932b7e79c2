"""`arcsim shard`'s study (:mod:`.price`: every strategy for a model priced from its shapes and the device model,
no gradients needed), ZeRO++'s quantised reductions measured on a trace (:mod:`.quant`, by
arcsim.compressors.sharded), and FSDP2 itself run on gloo ranks to check the schedule (:mod:`.fsdp_probe`) and on
the emulated cluster (:mod:`.emulated`). The schedule, units, memory and timeline are the strategy layer's
(arcsim.strategy). See docs/sharding.md."""
