"""The SimPy simulator of the serving pipeline; it drives the shared scheduler core.

Importing it imports no torch (see tests/test_sim_replay.py).
"""
