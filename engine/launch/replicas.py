"""Where each data-parallel replica runs: its GPUs, its TP rendezvous, its share of a GPU.

On CUDA replica ``r`` of ``--tp T`` owns GPUs ``r*T .. r*T+T-1``; with
``--dp-share-gpu`` every replica runs on GPUs ``0 .. T-1`` and takes
``1/dp`` of the memory the runner may use there. On CPU the replicas share
the cores.
"""

from __future__ import annotations

import socket
from dataclasses import replace

from engine.ipc.config import ServeConfig


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpu_count() -> int:
    """The CUDA devices this process can see."""
    import torch

    return int(torch.cuda.device_count())


def check_placement(device: str, dp: int, tp: int, share_gpu: bool, gpus: int) -> None:
    """Raise ``ValueError`` when ``dp`` replicas of ``tp`` ranks cannot be placed on ``gpus``."""
    if share_gpu and device != "cuda":
        raise ValueError("--dp-share-gpu shares CUDA devices; it needs --device cuda")
    if share_gpu and dp == 1:
        raise ValueError("--dp-share-gpu needs --dp 2 or more")
    if device != "cuda":
        return
    needed = tp if share_gpu else dp * tp
    if gpus < needed:
        how = (
            f"--dp-share-gpu puts every replica on GPUs 0..{tp - 1}"
            if share_gpu
            else f"--dp {dp} --tp {tp} gives each replica its own {tp} GPU(s); "
            "--dp-share-gpu puts the replicas on the same GPUs"
        )
        raise ValueError(f"{needed} GPU(s) needed, {gpus} visible: {how}")


def replica_configs(cfg: ServeConfig, share_gpu: bool) -> list[ServeConfig]:
    """Each replica's config: its index, its first device, its rendezvous and GPU share."""
    out = []
    for r in range(cfg.dp_size):
        device = cfg.device
        if cfg.device == "cuda" and not share_gpu:
            device = f"cuda:{r * cfg.tp_size}"
        runner = replace(
            cfg.runner,
            device=device,
            gpu_share=cfg.dp_size if share_gpu else 1,
            dist_init=f"tcp://127.0.0.1:{free_tcp_port()}" if cfg.tp_size > 1 else "",
        )
        out.append(replace(cfg, replica=r, runner=runner))
    return out
