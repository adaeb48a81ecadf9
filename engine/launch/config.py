"""The configuration every process of one ``engine serve`` reads, and its socket addresses."""

from __future__ import annotations

from pathlib import Path

import msgspec


class ServeConfig(msgspec.Struct, kw_only=True):
    """Everything the children need, written as JSON into the run directory.

    ``model`` is the name clients use; ``model_path`` is the HF folder it
    resolved to. ``max_model_len`` bounds prompt plus output tokens.
    """

    model: str
    model_path: str
    run_dir: str
    parent_pid: int
    max_model_len: int
    device: str = "cpu"
    dtype: str = "auto"
    tp_size: int = 1
    num_tokenizers: int = 1
    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = "fcfs"
    dummy_weights: bool = False
    api_key: str | None = None
    max_running: int = 256
    max_prefill_tokens: int = 8192
    num_pages: int | None = None
    page_size: int = 16
    prefix_cache: bool = True
    cpu_threads: int | None = None
    seed: int = 0
    dist_init: str = ""
    log_level: str = "info"

    def addr(self, name: str) -> str:
        """The ``ipc://`` address of the socket ``name`` inside the run directory."""
        return f"ipc://{Path(self.run_dir) / name}.sock"

    def tokenizer_addr(self, index: int) -> str:
        return self.addr(f"tokenizer{index}")

    @property
    def scheduler_addr(self) -> str:
        return self.addr("scheduler")

    @property
    def detokenizer_addr(self) -> str:
        return self.addr("detokenizer")

    @property
    def frontend_addr(self) -> str:
        return self.addr("frontend")

    @property
    def ready_addr(self) -> str:
        return self.addr("ready")

    def save(self) -> Path:
        path = Path(self.run_dir) / "config.json"
        path.write_bytes(msgspec.json.encode(self))
        return path

    @staticmethod
    def load(path: str | Path) -> ServeConfig:
        return msgspec.json.decode(Path(path).read_bytes(), type=ServeConfig)
