"""Wire messages, the run directory and the serve config, without starting processes."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from core.scheduler import SchedulerStats
from engine.ipc import messages
from engine.ipc.config import ServeConfig
from engine.launch.launcher import Launcher
from engine.launch.rundir import make_run_dir, remove_run_dir
from engine.launch.serve import build_parser, serve_main
from engine.runner.args import RunnerArgs
from engine.sampling.params import SamplingParams

EXAMPLES: list[messages.Message] = [
    messages.GenerateRequest(
        rid="a",
        sampling=SamplingParams(temperature=0.0, stop=["\n"], max_new_tokens=4),
        received=1.5,
        messages=[messages.ChatMessage(role="user", content="héllo 🎉")],
        max_tokens_explicit=False,
    ),
    messages.TokenizedRequest(
        rid="b", input_ids=[1, 2], sampling=SamplingParams(), received=1.0, tokenized=2.0
    ),
    messages.AbortRequest(rid="c"),
    messages.TokenBatch(
        items=[messages.TokenItem(rid="d", token_ids=[5], token_times=[3.0], stop=["x"])]
    ),
    messages.TextBatch(
        items=[messages.TextItem(rid="e", text="t", token_ids=[], token_times=[], error="bad")]
    ),
    messages.StatsUpdate(time=0.0, stats=SchedulerStats(8, 2, 6, 1, 0, 1, 10, 4)),
    messages.Ready(role="tokenizer", rank=0, pid=1, info={"num_pages": 8}),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_messages_round_trip_through_msgpack(msg: messages.Message) -> None:
    data = messages.encode(msg)
    assert b"\x80\x04" not in data[:2]  # not a pickle
    assert messages.decode(data) == msg


def test_garbage_is_a_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        messages.decode(b"\x93\x01\x02")
    with pytest.raises(msgspec.DecodeError):
        messages.decode(msgspec.msgpack.encode({"type": "Nope", "rid": "x"}))


def test_run_dir_is_private_and_removable() -> None:
    path = make_run_dir()
    try:
        assert (path.stat().st_mode & 0o777) == 0o700
        cfg = ServeConfig(
            model="m",
            runner=RunnerArgs(model="/m"),
            tokenizer_path="/m",
            vocab_size=512,
            run_dir=str(path),
            parent_pid=os.getpid(),
            max_model_len=64,
        )
        assert ServeConfig.load(cfg.save()) == cfg
        assert cfg.tokenizer_addr(1) == f"ipc://{path}/tokenizer1.sock"
    finally:
        remove_run_dir(path)
    assert not Path(path).exists()


def test_serve_options_are_validated() -> None:
    parser = build_parser()
    args = parser.parse_args(["--model", "m", "--tp", "2", "--num-tokenizers", "3", "--port", "0"])
    assert (args.tp_size, args.num_tokenizers, args.port) == (2, 3, 0)
    for bad in (["--model", "m", "--tp", "0"], ["--model", "m", "--device", "tpu"], []):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


@pytest.mark.parametrize("layout", ["frontend", "inline"])
def test_tokenizer_workers_are_split_s_alone(
    layout: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        serve_main(["--model", "smollm2-135m", "--layout", layout, "--num-tokenizers", "2"])
    assert exit_.value.code == 2
    assert "only --layout split has" in capsys.readouterr().err
    cfg = ServeConfig(
        model="m", runner=RunnerArgs(model="m"), tokenizer_path="t", vocab_size=8,
        run_dir=str(tmp_path), parent_pid=1, max_model_len=8, layout=layout,
    )  # fmt: skip
    assert Launcher([cfg]).expected_ready() == {"scheduler0"}
    assert cfg.token_addr == cfg.frontend_addr
