"""The tests' Redis: harness/redis_server.py (the benchmarks start the same one)."""

from harness.redis_server import RedisServer

__all__ = ["RedisServer"]
