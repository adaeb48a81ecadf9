"""A replay of a disaggregated cluster (``SimConfig.prefill_replicas``, ``decode_replicas``):
its schedulers, the cluster and its part of the summary (``sim.model.pd_cluster``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from core.router import Router
from core.scheduler import Scheduler, SchedulerConfig
from sim.config import SimConfig
from sim.costs import read_profile
from sim.costs.base import CpuCosts, GpuCostModel
from sim.costs.transfer import transfer_costs
from sim.model.pd_cluster import PDCluster
from sim.model.replica import RequestRecords
from sim.replicas import router_summary


def pd_schedulers(config: SimConfig, sched_config: SchedulerConfig) -> list[Any]:
    """The prefill replicas' scheduler cores, then the decode replicas'."""
    prefill = replace(sched_config, role="prefill")
    decode = replace(sched_config, role="decode")
    return [Scheduler(prefill) for _ in range(config.prefill_replicas)] + [
        Scheduler(decode) for _ in range(config.decode_replicas)
    ]


def pd_cluster(
    records: RequestRecords,
    schedulers: list[Any],
    costs: tuple[GpuCostModel, CpuCosts],
    config: SimConfig,
    **options: Any,
) -> PDCluster:
    """The disaggregated cluster of ``schedulers`` (``pd_schedulers``): both routers with the
    config's router settings, the KV transfer priced by the config or its profile;
    ``options`` as ``Cluster`` takes them."""
    profile = read_profile(config.profile) if config.profile else None
    transfer = transfer_costs(
        profile,
        config.kv_bytes_per_token_per_gpu(),
        config.transfer_latency_s,
        config.transfer_gbps,
    )
    routers = (Router(config.router), Router(config.router))
    return PDCluster(
        records, schedulers, config.prefill_replicas, routers, costs, transfer, **options
    )


def pd_summary(sim: Any) -> dict[str, Any]:
    """What the disaggregated cluster did (``{"enabled": false}`` for any other run): its
    replicas, the requests each prefill replica computed, the KV transfers and their price,
    and the prefill router's decisions (``router`` in the summary is the decode router's)."""
    if not isinstance(sim, PDCluster):
        return {"enabled": False}
    placed = np.bincount(np.asarray(sim.prefill_of)[np.asarray(sim.prefill_of) >= 0],
                         minlength=sim.num_prefill)  # fmt: skip
    return {
        "enabled": True,
        "prefill_replicas": sim.num_prefill,
        "decode_replicas": len(sim.replicas) - sim.num_prefill,
        "prefill_requests": [int(n) for n in placed],
        "transfers": sim.totals.describe(),
        "transfer_costs": sim.transfer.describe(),
        "control_message_s": sim.ipc,
        "prefill_router": router_summary(sim.prefill_router),
    }
