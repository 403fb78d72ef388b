"""The real-server harness is shared with the benchmarks."""

from bench.harness import RunningServer, free_port

__all__ = ["RunningServer", "free_port"]
