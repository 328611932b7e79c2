"""Sharded data parallel (FSDP2 ``fully_shard`` / ZeRO-3, and hybrid sharding HSDP) priced like DDP: the
collectives a step issues (:mod:`.schedule`), the memory per GPU (:mod:`.memory`), a two-stream timeline
(:mod:`.timeline`), quantised collectives as ZeRO++ runs them and their error on real gradients
(:mod:`.quant`), and the whole iteration on a topology (:mod:`.price`). See docs/sharding.md."""

from arcsim.sharding.schedule import STRATEGIES, ShardCollective, fsdp_schedule
from arcsim.sharding.units import ShardUnit, group_units

__all__ = ["STRATEGIES", "ShardCollective", "ShardUnit", "fsdp_schedule", "group_units"]
