"""The shared cores: pure Python, standard library only, no clock."""
