"""What crosses the engine's process boundaries: the typed messages, the config every process
reads, and the ZeroMQ sockets. Below every process; imports none of them."""
