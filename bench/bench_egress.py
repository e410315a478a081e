"""What the egress proxy costs: a download through it against the same download on the
bridge, and a sandbox ready with egress against one without, in the same run.

A network of the bench's own (198.51.100.0/24, outside every range the proxy refuses) holds
a file server with a ``--mb`` MB file. Timed, interleaved:

- the download by a client container on the job's internal network, through the proxy
  (Squid, its allow list naming the server), against the same download by a client
  container on the outside network, straight to the server (the reference): the time of
  the transfer inside the client (Python's urllib), not the container's start;
- a sandbox started and greeted with no network, against the job's proxy started and a
  sandbox started on its network (what a job whose checks declare egress adds).

    python3 bench/bench_egress.py [--runtime runc|runsc] [--runs 7] [--mb 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import docker
from docker.types import EndpointConfig, IPAMConfig, IPAMPool

from common import fmt_ms, loadavg, print_table, remove_labelled
from controller.config.limits import Limits
from controller.config.network import EgressRule
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.dockerclient import connect
from controller.sandbox.egress import EgressProxy
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import JOB, current_identity, new_job_id
from controller.sandbox.proxyimage import proxy_image

HOST = "files.bench.test"
PORT = 8000
SERVER = """
import functools, http.server, os, sys
os.makedirs("/tmp/www", exist_ok=True)
with open("/tmp/www/file", "wb") as fh:
    fh.write(os.urandom(int(sys.argv[1]) << 20))
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/tmp/www")
handler.func.log_message = lambda *a: None
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), handler).serve_forever()
"""
CLIENT = """
import json, sys, time, urllib.request
url, runs = sys.argv[1], int(sys.argv[2])
for _ in range(100):
    try:
        urllib.request.urlopen(url.rsplit("/", 1)[0] + "/", timeout=2).read()
        break
    except OSError:
        time.sleep(0.1)
took = []
for _ in range(runs):
    started = time.perf_counter()
    size = len(urllib.request.urlopen(url, timeout=60).read())
    took.append(time.perf_counter() - started)
print(json.dumps({"size": size, "seconds": took}))
"""


def _client(
    client: docker.DockerClient,
    image: str,
    where: tuple[str, dict[str, str]],
    url: str,
    runtime: str,
) -> list[float]:
    """One download of ``url`` by a client container on network ``where[0]`` with the
    variables ``where[1]``, under the Docker runtime ``runtime``."""
    network, env = where
    out = client.containers.run(
        image,
        entrypoint=["python3", "-I", "-S", "-c", CLIENT, url, "1"],
        user="10001:10001",
        cap_drop=["ALL"],
        network=network,
        environment=env,
        runtime=runtime,
        labels=current_identity().labels(BENCH_JOB, "bench"),
        remove=True,
    )
    data = json.loads(out.decode().strip().splitlines()[-1])
    return [float(s) for s in data["seconds"]]


BENCH_JOB = new_job_id()


def main() -> None:  # noqa: PLR0915 - one bench, set up and torn down in one place
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--mb", type=int, default=10)
    args = parser.parse_args()
    runtime: Runtime = args.runtime
    client = connect()
    builder = ImageBuilder(client)
    image = builder.ensure().tag
    proxy_tag = proxy_image(client, builder.resolve_base(None)[0])
    labels = current_identity().labels(BENCH_JOB, "bench")
    outside = client.networks.create(
        f"pb-bench-outside-{uuid.uuid4().hex[:8]}",
        driver="bridge",
        ipam=IPAMConfig(pool_configs=[IPAMPool(subnet="198.51.100.0/24")]),
        labels=labels,
    )
    name = outside.name or ""
    proxy: EgressProxy | None = None
    try:
        server = client.containers.run(
            image,
            entrypoint=["python3", "-I", "-S", "-c", SERVER, str(args.mb)],
            user="10001:10001",
            cap_drop=["ALL"],
            network=name,
            networking_config={name: EndpointConfig(client.api.api_version, aliases=[HOST])},
            labels=labels,
            detach=True,
        )
        proxy = EgressProxy.start(
            client, name=f"pb-bench-egress-{uuid.uuid4().hex[:8]}", labels=labels,
            image=proxy_tag, outside=name,
        )  # fmt: skip
        proxy.allow([EgressRule(HOST, PORT)])
        url = f"http://{HOST}:{PORT}/file"
        through: list[float] = []
        direct: list[float] = []
        # a gVisor client needs the runtime that gives it a network, on either network
        client_runtime = "runsc-egress" if runtime == "runsc" else "runc"
        for _ in range(args.runs):  # interleaved: the same noise for both
            direct += _client(client, image, (name, {}), url, client_runtime)
            through += _client(
                client, image, (proxy.network, proxy.environment()), url, client_runtime
            )
        proxy.allow([])

        plain_ready: list[float] = []
        egress_ready: list[float] = []
        limits = Limits(memory_mb=512, workspace_mb=128)
        docker_runtime = "runsc-egress" if runtime == "runsc" else None
        for _ in range(args.runs):
            spec = SandboxSpec(image=image, job_id=BENCH_JOB, runtime=runtime, limits=limits)
            started = time.perf_counter()
            with DockerSandbox.start(client, spec, current_identity()):
                plain_ready.append(time.perf_counter() - started)
            started = time.perf_counter()
            job_proxy = EgressProxy.start(
                client, name=f"pb-bench-egress-{uuid.uuid4().hex[:8]}", labels=labels,
                image=proxy_tag, outside=name,
            )  # fmt: skip
            try:
                spec = spec.model_copy(
                    update={
                        "network": job_proxy.network,
                        "docker_runtime": docker_runtime,
                        "run_env": job_proxy.environment(),
                    }
                )
                with DockerSandbox.start(client, spec, current_identity()):
                    egress_ready.append(time.perf_counter() - started)
            finally:
                job_proxy.close()
        server.remove(force=True)
    finally:
        if proxy is not None:
            proxy.close()
        remove_labelled(client, f"{JOB}={BENCH_JOB}")
        outside.remove()

    def med(values: list[float]) -> float:
        return statistics.median(values)

    mbps_direct = args.mb / med(direct)
    mbps_through = args.mb / med(through)
    print(f"\nruntime {runtime}; {args.runs} runs each, interleaved; load {loadavg()}")
    print_table(
        ["what", "median", "min", "max"],
        [
            [f"{args.mb} MB on the bridge (reference)", fmt_ms(med(direct)),
             fmt_ms(min(direct)), fmt_ms(max(direct))],
            [f"{args.mb} MB through the proxy", fmt_ms(med(through)),
             fmt_ms(min(through)), fmt_ms(max(through))],
            ["ratio: through the proxy / bridge (median)", f"{med(through) / med(direct):.2f}",
             f"{mbps_through:.0f} MB/s", f"{mbps_direct:.0f} MB/s bridge"],
            ["sandbox ready, no network (reference)", fmt_ms(med(plain_ready)),
             fmt_ms(min(plain_ready)), fmt_ms(max(plain_ready))],
            ["proxy + sandbox ready on its network", fmt_ms(med(egress_ready)),
             fmt_ms(min(egress_ready)), fmt_ms(max(egress_ready))],
            ["ratio: with egress / without (median)",
             f"{med(egress_ready) / med(plain_ready):.2f}", "", ""],
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
