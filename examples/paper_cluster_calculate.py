"""The DDLF paper's Example 3.3 on the Cluster API: a + b - c on three workers.

    python examples/paper_cluster_calculate.py                 # embedded cluster
    python examples/paper_cluster_calculate.py cluster.toml    # hosts from read_config()
"""

from __future__ import annotations

import asyncio
import sys

from ddlf_actors import Cluster, read_config


async def calculate(self, a, b, c):
    return a + b - c


async def main(config: str | None = None) -> list:
    if config:
        hosts, ports = read_config(config)
        cluster = Cluster(hosts, ports)
    else:
        cluster = Cluster(workers_per_node=3)  # three workers on the local embedded cluster
    await cluster.connect()
    results = [
        await cluster.run_method(calculate, a=10, b=8, c=2),
        await cluster.run_method(calculate, dict(a=10, b=8, c=2), dict(a=100, b=80, c=20),
                                 dict(a=1000, b=800, c=200)),
        await cluster.run_method(calculate, dict(a=10, b=8, c=2), dict(a=100, b=80, c=20)),
    ]
    for r in results:
        print(f"Results: {r}")
    await cluster.close()
    return results


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
