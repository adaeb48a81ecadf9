"""Starting, watching and stopping the processes of ``engine serve``."""
