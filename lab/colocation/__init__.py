"""``sim colocation``: fit and check the co-location table of replicas that share a GPU."""
