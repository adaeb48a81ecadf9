"""``engine serve``'s flags and the config they build, from the settings' declarations.

Every flag comes from a field that declares its default and help once
(``core.settings``): the serve config's own (``ServeConfig``), the runner's
(``RunnerArgs``), the scheduler core's, the router core's, the drafter's
(``SpeculativeConfig``), and the few that only steer the launch
(``LaunchOptions``). The flags default to None; a flag
left out keeps its field's default.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace
from pathlib import Path

from core.router.options import add_router_flags, router_config
from core.scheduler import SchedulerConfig
from core.scheduler.config import ROLES
from core.scheduler.options import add_scheduler_flags, scheduler_config
from core.settings import add_flags, given, positive_int, setting
from engine.ipc.config import ServeConfig
from engine.ipc.host_profile import check_dir
from engine.launch.model_source import ModelSource
from engine.launch.replicas import check_placement, gpu_count
from engine.runner.args import RunnerArgs
from engine.speculative import SpeculativeConfig


@dataclass(frozen=True)
class LaunchOptions:
    """The settings that steer the launch itself and reach no process as they are."""

    tokenizer: str | None = setting(
        None,
        "tokenizer: known model name or HF folder (default: the model's own; "
        "smollm2-135m for a preset)",
    )
    dp_share_gpu: bool = setting(
        False,
        "put every replica on the same GPU(s), each with 1/dp of the memory the weights and "
        "KV pool may take (--mem-fraction; CUDA)",
    )
    max_model_len: int | None = setting(
        None,
        "longest prompt plus output in tokens (default: the model's context)",
        parse=positive_int,
    )
    ready_timeout: float = setting(600.0, "seconds the processes may take to get ready")
    role: str = setting(
        "colocated",
        "this server's part in prefill/decode disaggregation: colocated (both), prefill (a "
        "request ends after its first token and its KV goes to a decode server) or decode "
        "(requests arrive with their KV); prefill and decode serve behind "
        "`engine router --prefill URL --decode URL` (the scheduler core's role)",
        choices=ROLES,
    )


def build_parser() -> argparse.ArgumentParser:
    """The whole parser of ``engine serve``."""
    p = argparse.ArgumentParser(prog="engine serve", description="Serve a model over HTTP.")
    add_flags(p, ServeConfig)
    add_flags(p.add_argument_group("launch", "how the processes start"), LaunchOptions)
    add_flags(p.add_argument_group("runner", "the model runner's settings"), RunnerArgs)
    add_scheduler_flags(p)
    add_flags(p.add_argument_group("speculative", "speculative decoding"), SpeculativeConfig)
    add_router_flags(p, "--dp N")
    return p


def launch_options(args: argparse.Namespace) -> LaunchOptions:
    return LaunchOptions(**given(args, LaunchOptions))


def check_replicas(cfg: ServeConfig, share_gpu: bool) -> None:
    """Raise ``ValueError`` when ``--dp`` replicas cannot be placed as asked."""
    gpus = gpu_count() if cfg.device == "cuda" else 0
    check_placement(cfg.device, cfg.dp_size, cfg.tp_size, share_gpu, gpus)


def check_role(role: str, runner: RunnerArgs, dp: int, speculative: SpeculativeConfig) -> None:
    """Raise ``ValueError`` when a prefill or decode server cannot run as asked: its KV moves
    from or into scheduler rank 0's pool, so one rank and one replica; it runs no drafter."""
    if role == "colocated":
        return
    if runner.tp_size > 1:
        raise ValueError(
            f"--role {role} needs --tp 1: the KV transfer moves scheduler rank 0's pool, and "
            f"with --tp {runner.tp_size} each rank holds a shard of it"
        )
    if dp > 1:
        raise ValueError(f"--role {role} needs --dp 1: run one server per replica instead")
    if speculative.on:
        raise ValueError(
            f"--role {role} with --speculative {speculative.method}: speculative decoding is "
            "not served with prefill/decode disaggregation (run it colocated)"
        )


def make_config(
    args: argparse.Namespace, source: ModelSource, run_dir: Path, port: int | None = None
) -> ServeConfig:
    """The config of this server, from its options and the model it resolved to (``port``, when
    given, in place of ``--port``'s); ``ValueError`` on a bad setting."""
    speculative = SpeculativeConfig(**given(args, SpeculativeConfig))
    k_given = "num_draft_tokens" in given(args, SchedulerConfig)
    role = launch_options(args).role
    runner = RunnerArgs(
        **given(args, RunnerArgs),
        model=source.model_path,
        vocab_limit=source.vocab_limit,
        scheduler=replace(speculative.check(scheduler_config(args), k_given), role=role),
    )
    if speculative.method == "self" and speculative.draft_layers is not None:
        from engine.runner.model_runner import load_config
        from engine.speculative.self_draft import check_self_draft

        layers = load_config(runner)[0].num_layers
        check_self_draft(speculative.draft_layers, layers, runner.tp_size)
    values = given(args, ServeConfig)
    check_role(role, runner, values.get("dp_size", 1), speculative)
    layout = values.get("layout", "split")
    if layout != "split" and values.get("num_tokenizers", 1) > 1:
        raise ValueError(
            f"--num-tokenizers sets tokenizer worker processes, which only --layout split has; "
            f"--layout {layout} tokenizes in one place"
        )
    if "record_steps" in values:
        values["record_steps"] = str(Path(values["record_steps"]).resolve())
    if "host_profile" in values:
        values["host_profile"] = str(check_dir(values["host_profile"]))
    context_len = source.context_len
    max_model_len = launch_options(args).max_model_len or context_len
    return ServeConfig(
        **(values if port is None else values | {"port": port}),
        runner=runner,
        router=router_config(args),
        speculative=speculative,
        tokenizer_path=str(source.tokenizer_path),
        vocab_size=source.vocab_size,
        eos_token_ids=list(source.eos_token_ids),
        run_dir=str(run_dir),
        parent_pid=os.getpid(),
        max_model_len=min(max_model_len, context_len),
    )
