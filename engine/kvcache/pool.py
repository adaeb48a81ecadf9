"""A paged KV pool.

Layout, per layer and for K and V alike::

    [num_pages, page_size, num_kv_heads_local, head_dim]

A token at position ``p`` of a request with page table ``pages`` lives at page
``pages[p // page_size]``, slot ``p % page_size``; its *flat slot* is
``page * page_size + slot``, the row index into the ``[num_pages * page_size,
kv_heads, head_dim]`` view. Page ids come from the scheduler; the pool never
allocates, it only stores. It starts zeroed so that padded reads of unused
slots stay finite. One extra page past ``num_pages``, ``scratch_page``, is never
handed out: padded rows of a CUDA-graph batch write and read there.
"""

from __future__ import annotations

import torch


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(
                f"need num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}"
            )
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.scratch_page = num_pages
        shape = (num_pages + 1, page_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_page(
        num_layers: int, page_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Bytes of one page across all layers, K and V."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * page_size * num_kv_heads * head_dim * itemsize

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``layer`` as ``[num_pages * page_size, kv_heads, head_dim]`` views."""
        shape = (-1, self.num_kv_heads, self.head_dim)
        return self.k[layer].view(shape), self.v[layer].view(shape)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new ``k``/``v`` (``[T, kv_heads, head_dim]``) at flat ``slots`` (``[T]``)."""
        k_flat, v_flat = self.flat(layer)
        k_flat.index_copy_(0, slots, k)
        v_flat.index_copy_(0, slots, v)
