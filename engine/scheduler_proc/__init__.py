"""The scheduler/engine process of each tensor-parallel rank."""
