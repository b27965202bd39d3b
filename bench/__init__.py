"""Benchmarks of redisbus beside raw redis-py and FastStream (SPEC §10): python -m bench."""
