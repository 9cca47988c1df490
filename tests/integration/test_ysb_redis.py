"""The demo's private redis-server and the RESP client, on a real redis-server."""

from __future__ import annotations

import psutil
import pytest

from coordinator.workloads.ysb.redis import RedisError, RedisServer


def test_private_redis_server_round_trip_and_stop() -> None:
    with RedisServer() as server:
        assert server.process is not None
        pid = server.process.pid
        with server.client() as client:
            assert client.command("PING") == "PONG"
            assert client.command("HSET", "ysb:window:c1:0", "events", 12, "campaign_id", "c1") == 2
            assert client.command("HGET", "ysb:campaign:c1", "0") is None
            assert client.hgetall("ysb:window:c1:0") == {"events": "12", "campaign_id": "c1"}
            for i in range(1500):  # more than one SCAN page
                client.command("SET", f"ysb:window:k{i}", i)
            assert len(client.keys("ysb:window:*")) == 1501
            with pytest.raises(RedisError, match="WRONGTYPE"):
                client.command("LPUSH", "ysb:window:c1:0", "x")
    assert server.process is None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
