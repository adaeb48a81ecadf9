"""Tensor-parallel partitioning and the process group the model's collectives use."""
