"""``nearshore up [TOPOLOGY]``: bring the topology up, say how to use it, stop it all on Ctrl-C.

While it runs, a child that dies is reported and the rest keeps running (``harness.supervise``): a killed
region is the edge's failover, not the end of the run. ``--restart`` starts dead children again."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from harness.launcher import ESSENTIAL, Launcher, RunningTopology, default_run_dir
from harness.supervise import RestartPolicy, Supervisor
from harness.topology import describe, load_topology
from nearshore.config import ConfigError

POLL_S = 0.5  # how often the children are looked at: a death is reported within this


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topology", nargs="?", default="lagos", help="a name in configs/topologies or a file")
    parser.add_argument("--run-dir", type=Path, help="where logs, keys, certificates and state go")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="start a child that dies again (same ports and log), backing off from 1s to 30s; "
        "give up on one restarted 5 times within 5 minutes",
    )


def usage_text(running: RunningTopology, restart: bool = False) -> str:
    key, url, ca, model = running.api_key, running.edge_url, running.edge_ca, running.chat_model
    then = "; it is started again" if restart else ""
    return f"""
Nearshore is up: {running.name}
  edge (as the Lagos user reaches it): {url}
  API key:                             {key}
  trust this certificate:              {ca}
  links control API:                   {running.control_url}/links
  Prometheus scrape config:            {running.prometheus_config}

Try it:
  nearshore chat "What should I see in Lagos?"

  curl --cacert {ca} {url}/v1/chat/completions \\
    -H "Authorization: Bearer {key}" -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "stream": true, "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  python -c "
import openai
c = openai.OpenAI(base_url='{url}/v1', api_key='{key}', http_client=openai.DefaultHttpxClient(verify='{ca}'))
print(c.chat.completions.create(model='{model}', messages=[{{'role': 'user', 'content': 'Hello!'}}]))"

Ctrl-C stops everything. A region that dies is reported here and the rest keeps running{then}.
"""


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    topology = load_topology(args.topology)
    run_dir = args.run_dir or default_run_dir(topology)
    print(f"starting {topology.name}: {describe(topology)}", flush=True)
    launcher = Launcher(topology, run_dir, progress=lambda line: print(line, flush=True))
    # SIGTERM (and a closed terminal) end `up` like Ctrl-C does, so the finally clause stops every child;
    # on SIGKILL the children get SIGTERM from the kernel (harness.procs).
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    # And SIGINT itself, whatever was inherited: a shell without job control starts a background job with
    # SIGINT ignored, and Python then leaves it ignored, so Ctrl-C (or a script's SIGINT) did nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        running = launcher.start()
        print(usage_text(running, args.restart), flush=True)
        supervisor = Supervisor(
            launcher.processes,
            essential=ESSENTIAL,
            policy=RestartPolicy() if args.restart else None,
            restart=lambda process: launcher.restart(process.name),
        )
        while True:
            time.sleep(POLL_S)
            reason = supervisor.poll()
            if reason is not None:
                print(f"nearshore up: {reason}: stopping (logs in {run_dir / 'logs'})", file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
        return 0
    except ConfigError:
        raise
    finally:
        launcher.stop()
