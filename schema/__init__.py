"""What both worlds read and write: traces, the request and step tables, metrics, the Perfetto
timeline. No torch, no SimPy, no sockets."""
