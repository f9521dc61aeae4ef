"""The localhost deployment of examples/flower/README.md, end to end, in one command:

    python examples/flower/deploy_localhost.py WORKDIR [--kill-node 1 --kill-after 3]

It makes certificates (a CA, the SuperLink's TLS certificate, three SuperNode keys), exports
the three clients of ``deployment.yaml`` to their own folders, starts a SuperLink with TLS and
SuperNode authentication, registers the three keys, starts three SuperNodes (each pointed only
at its own folder, without FEDSHIFT_DATA), and runs the config on them. With ``--kill-node``,
that node is killed (SIGKILL to all its processes: the command, Flower's SuperNode, its
SuperExec and ClientApp) ``--kill-delay`` seconds after
``--kill-after`` rounds are in the run's metrics (during the next round), and started again two
seconds later. Then the same config runs as a
simulation (``fedshift run``) and the two runs' metrics are printed side by side.

With ``--outside``, the SuperLink listens on every interface, its certificate also names this
machine's non-loopback address, and the nodes connect through that address (as from another
machine); before the run, a node registration (``flwr supernode register`` of a key of its
own) and a run submission (``flwr run``) are tried through it and must be refused by the
SuperLink's guard, while the same registration through the loopback is accepted.

Logs and folders stay in WORKDIR: certs/, clients/, run/ (the deployment's run directory),
sim/ (the simulation's), superlink.log, node<i>.log, run.log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "deployment.yaml"
FEDSHIFT = [sys.executable, "-m", "fedshift.cli"]


def start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """A background process in its own process group (killed with its children)."""
    out = log.open("a")
    return subprocess.Popen(
        argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it (a node: the fedshift command, Flower's SuperNode in
    a session of its own, its SuperExec and ClientApp processes)."""
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [pid, *(p for k in kids.split() for p in tree(int(k)))]


def kill_node(proc: subprocess.Popen) -> list[int]:
    """SIGKILL a node's every process at once, as when its machine goes down."""
    pids = tree(proc.pid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def outside_address() -> str:
    """This machine's address on its default route (not the loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent
        address = s.getsockname()[0]
    if address.startswith("127."):
        raise SystemExit("--outside: this machine has no address but the loopback")
    return address


def try_from(home: Path, address: str, certs: Path, w: Path, env: dict[str, str]) -> None:
    """A registration and a run submission through ``address``; print what Flower said."""
    from fedshift.flower.security import flower_connection_toml

    home.mkdir(exist_ok=True)
    toml = flower_connection_toml("fedshift", address, str(certs / "ca.crt"), False)
    (home / "config.toml").write_text(toml)
    env = {**env, "FLWR_HOME": str(home)}
    flwr = str(Path(sys.executable).parent / "flwr")
    subprocess.run([*FEDSHIFT, "deploy", "certs", str(w / "intruder"), "--nodes", "1",
                    "--overwrite"], check=True, env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    tries = {
        "register a key of its own": [flwr, "supernode", "register",
                                      str(w / "intruder" / "node0.pub"), "fedshift"],
        "submit a run": [flwr, "run", str(HERE), "fedshift"],
    }  # fmt: skip
    for what, argv in tries.items():
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        said = " ".join((res.stdout + res.stderr).replace("│", " ").split())
        refused = said[said.find("fedshift guard:") :].split(": this SuperLink")[0]
        print(f"from {address}: {what}: exit {res.returncode}: {refused or said[-200:]}",
              flush=True)  # fmt: skip


def rounds_done(run: Path) -> int:
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--port", type=int, default=18000, help="the SuperLink's port")
    ap.add_argument("--kill-node", type=int, default=None, help="the node to kill and restart")
    ap.add_argument("--kill-after", type=int, default=3, help="rounds done before the kill")
    ap.add_argument("--kill-delay", type=float, default=4.0, help="seconds later (mid-round)")
    ap.add_argument("--resend-s", type=float, default=30.0)
    ap.add_argument("--outside", action="store_true", help="nodes and intruders come through "
                    "this machine's non-loopback address")  # fmt: skip
    args = ap.parse_args()
    w = args.workdir.resolve()
    w.mkdir(parents=True, exist_ok=True)
    link = f"127.0.0.1:{args.port}"
    outside = outside_address() if args.outside else None
    node_link = f"{outside}:{args.port}" if outside else link
    names = ["127.0.0.1", "localhost", *([outside] if outside else [])]
    hosts = [arg for name in names for arg in ("--host", name)]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    node_env = {k: v for k, v in env.items() if k != "FEDSHIFT_DATA"}  # only their own folders
    run = subprocess.run
    run([*FEDSHIFT, "deploy", "certs", str(w / "certs"), "--nodes", "3", "--superlink", link,
         *hosts, "--overwrite"], check=True, env=env)  # fmt: skip
    run([*FEDSHIFT, "export", str(CONFIG), str(w / "clients")], check=True, env=env)
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["superlink"] = start(
            [*FEDSHIFT, "deploy", "superlink", "--certs", str(w / "certs"), "--port", str(args.port),
             "--host", "0.0.0.0" if outside else "127.0.0.1"],
            w / "superlink.log", env,
        )  # fmt: skip
        time.sleep(8)
        if outside:
            try_from(w / "flwr-outside", node_link, w / "certs", w, env)
        keys = [str(w / "certs" / f"node{i}.pub") for i in range(3)]
        run(
            [*FEDSHIFT, "deploy", "register", *keys, "--certs", str(w / "certs")],
            check=True,
            env=env,
        )

        def node(i: int) -> subprocess.Popen:
            argv = [*FEDSHIFT, "deploy", "node", "--data", str(w / "clients" / f"client_{i}"),
                    "--superlink", node_link, "--certs", str(w / "certs"),
                    "--key", str(w / "certs" / f"node{i}"), "--port", str(args.port + 100 + i)]  # fmt: skip
            return start(argv, w / f"node{i}.log", node_env)

        for i in range(3):
            procs[f"node{i}"] = node(i)
        time.sleep(5)
        job = start(
            [*FEDSHIFT, "deploy", "run", str(CONFIG), "--certs", str(w / "certs"), "--superlink",
             link, "--run-dir", str(w / "run"), "--overwrite", "--resend-s", str(args.resend_s)],
            w / "run.log", env,
        )  # fmt: skip
        if args.kill_node is not None:
            while rounds_done(w / "run") < args.kill_after and job.poll() is None:
                time.sleep(0.5)
            time.sleep(args.kill_delay)  # the next round's jobs are on their way
            k = f"node{args.kill_node}"
            pids = kill_node(procs[k])
            print(
                f"killed {k} ({len(pids)} processes) after round {rounds_done(w / 'run')}",
                flush=True,
            )
            kept = sorted(p.name for p in (w / "clients" / f"client_{args.kill_node}").glob(
                f".fedshift-node/*/client_{args.kill_node}/round_*.pt"))  # fmt: skip
            print(f"{k}'s store on disk: {', '.join(kept) or 'nothing'}", flush=True)
            time.sleep(2)
            procs[k] = node(args.kill_node)
            print(f"restarted {k}", flush=True)
        code = job.wait()
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
    if code != 0:
        print(f"the deployment's run failed (code {code}); see {w / 'run.log'}")
        return code
    run([*FEDSHIFT, "run", str(CONFIG), "executor=sequential", f"output.dir={w}", "name=sim",
         "--overwrite"], check=True, env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    print("round  local_acc deployment  local_acc simulation  train_loss deployment  simulation")
    dep = [json.loads(x) for x in (w / "run" / "metrics.jsonl").read_text().splitlines()]
    sim = [json.loads(x) for x in (w / "sim" / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(dep, sim, strict=True):
        print(f"{a['round']:5d}  {a['local_acc']:20.4f}  {b['local_acc']:20.4f}  "
              f"{a['train_loss']:21.6f}  {b['train_loss']:10.6f}")  # fmt: skip
    same = all(a["local_acc"] == b["local_acc"] for a, b in zip(dep, sim, strict=True))
    print("local_acc equal in every round:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
