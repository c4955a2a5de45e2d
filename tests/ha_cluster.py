"""A real high-availability PostgreSQL for the failover tests and the HA benchmark.

One etcd member (Debian ``etcd-server``, its v2 API: see ``config``) and three Patroni nodes (Debian ``patroni``) that run
PostgreSQL 15 from ``/usr/lib/postgresql/15/bin``, all on free loopback ports in a temp dir, as the
``postgres`` user when we are root.  Patroni's loop is made short (ttl 10 s, loop_wait 1 s,
retry_timeout 4 s) so a failover takes seconds, and the cluster runs in **synchronous mode, strict**:
a commit is acknowledged only once it is on the leader and on its synchronous standby, and with no
standby the leader accepts no commit at all (triscope's choice, docs/scaling.md#high-availability).

``HACluster.url()`` is the multi-host URL triscope's clients use (``?host=…&host=…`` with
``target_session_attrs=read-write``); ``leader()`` asks Patroni's REST API who leads;
``kill_leader_postgres()`` SIGKILLs the leader's postmaster; ``freeze_patroni()`` SIGSTOPs a node's
Patroni (it then cannot renew its leader key while its PostgreSQL lives on).

``HACluster(netns=True)`` (root): each Patroni + PostgreSQL node runs in a network namespace of its
own, joined by a veth pair to a bridge of the cluster's own in the root namespace, where etcd and
every client are; ``partition(node)`` takes the node's link down (no reply, no reset: what a
partitioned leader looks like to its clients, its standbys and the DCS) and ``heal(node)`` brings
it back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import free_port, wait_for_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
SCOPE = "triscope-ha"


def missing_parts() -> str | None:
    """Why the HA cluster cannot run here (None when every part is installed)."""
    need = {"patroni": shutil.which("patroni"), "etcd": shutil.which("etcd"),
            "PostgreSQL 15": str(PG_BIN) if (PG_BIN / "postgres").exists() else None}
    missing = [k for k, v in need.items() if not v]
    if missing:
        return f"{', '.join(missing)} not installed (Debian packages patroni, etcd-server, postgresql-15)"
    return None


def netns_refused() -> str | None:
    """Why the cluster cannot give each node a network namespace here (None when it can)."""
    if os.geteuid() != 0:
        return "network namespaces for the nodes need root"
    if shutil.which("ip") is None:
        return "ip (Debian package iproute2) not installed"
    if shutil.which("nsenter") is None:
        return "nsenter (Debian package util-linux) not installed"
    # everything the cluster's network needs, once: a namespace, a bridge, a veth pair into the namespace
    br, veth = f"tshp{os.getpid() % 100000}", f"tshv{os.getpid() % 100000}"
    why = None
    try:
        holder = NetNs()
    except (OSError, RuntimeError) as e:
        return f"a network namespace cannot be made here (unshare --net): {e}"
    try:
        for argv in (["ip", "link", "add", br, "type", "bridge"],
                     ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(holder.pid)],
                     ["ip", "link", "set", veth, "master", br, "up"], [*holder.enter(), "ip", "link", "set", "eth0", "up"]):
            r = subprocess.run(argv, capture_output=True, text=True)
            if r.returncode != 0:
                why = f"{' '.join(argv[:3])} refused here: {r.stderr.strip()}"
                break
    finally:
        for cmd in (["link", "del", veth], ["link", "del", br]):
            subprocess.run(["ip", *cmd], capture_output=True)
        holder.close()
    return why


class NetNs:
    """A network namespace held by a sleeping process of its own (``unshare --net``), entered with
    ``nsenter --net=/proc/PID/ns/net``: no ``ip netns`` (its bind mounts of /run/netns outlive the
    namespaces, and ``ip netns exec`` remounts /sys, which a chroot refuses).  Gone with ``close()``
    once the processes started in it have ended."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["unshare", "--net", "sleep", "infinity"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        self.pid = self.proc.pid
        mine = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace").strip() if self.proc.stderr else ""
                raise RuntimeError(err or f"unshare exited with {self.proc.returncode}")
            try:
                if os.readlink(f"/proc/{self.pid}/ns/net") != mine:
                    return
            except OSError:
                pass
            time.sleep(0.01)
        self.close()
        raise RuntimeError("unshare --net did not move to a namespace of its own within 10 s")

    def enter(self) -> list[str]:
        return ["nsenter", f"--net=/proc/{self.pid}/ns/net"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(5)


def _ip_in(ns: NetNs, *args: str) -> None:
    r = subprocess.run([*ns.enter(), "ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} in namespace of {ns.pid}: {r.stderr.strip()}")


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


@dataclass
class Node:
    name: str
    pg_port: int
    api_port: int
    data: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    frozen: bool = False          # its API does not answer (SIGSTOPped, or cut off by a partition)
    host: str = "127.0.0.1"
    ns: NetNs | None = None        # its network namespace (netns mode)
    link: str | None = None        # the root namespace's end of its veth pair (netns mode)
    extra: dict[str, Any] = field(default_factory=dict)


class HACluster:
    def __init__(self, nodes: int = 3, *, ttl: int = 10, loop_wait: int = 1, retry_timeout: int = 4,
                 netns: bool = False) -> None:
        why = missing_parts() or (netns_refused() if netns else None)
        if why:
            raise RuntimeError(why)
        self.dir = Path(tempfile.mkdtemp(prefix="triscope-ha-"))
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        why = self.semaphores_refused()
        if why:
            raise RuntimeError(why)
        self.etcd_port, self.etcd_peer = free_port(), free_port()
        self.ttl, self.loop_wait, self.retry_timeout = ttl, loop_wait, retry_timeout
        self.nodes = [Node(f"pg{i}", free_port(), free_port(), self.dir / f"pg{i}" / "data",
                           self.dir / f"pg{i}.log") for i in range(nodes)]
        self.etcd: subprocess.Popen[bytes] | None = None
        self.etcd_host = "127.0.0.1"
        self.bridge: str | None = None
        self.subnet = "127.0.0.1/32"
        if netns:
            try:
                self._network(nodes)
            except Exception:
                self._network_down()     # nothing half-made is left behind (namespaces, links, mounts)
                shutil.rmtree(self.dir, ignore_errors=True)
                raise

    # ------------------------------------------------------------------ the network (netns mode)
    def _network(self, nodes: int) -> None:
        """A bridge with an address in the root namespace, one namespace + veth pair per node."""
        tag = f"{os.getpid() % 10000:04d}{self.etcd_port % 100:02d}"
        net = f"10.{200 + os.getpid() % 50}.{self.etcd_port % 250}"
        self.bridge, self.subnet, self.etcd_host = f"tsha{tag}", f"{net}.0/24", f"{net}.1"
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{net}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, n in enumerate(self.nodes):
            n.link, n.host = f"tsv{tag}{i}", f"{net}.{10 + i}"
            n.ns = NetNs()
            _ip("link", "add", n.link, "type", "veth", "peer", "name", "eth0", "netns", str(n.ns.pid))
            _ip("link", "set", n.link, "master", self.bridge, "up")
            for cmd in (("addr", "add", f"{n.host}/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                        ("link", "set", "lo", "up")):
                _ip_in(n.ns, *cmd)

    def _network_down(self) -> None:
        for n in self.nodes:
            if n.ns is not None:
                n.ns.close()           # the namespace ends with the last process in it (and its veth end with it)
            if n.link:
                subprocess.run(["ip", "link", "del", n.link], capture_output=True)
        if self.bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def partition(self, n: Node) -> None:
        """Take the node's link down: its packets, both ways, are dropped (nothing is reset)."""
        assert n.link, "partition() needs HACluster(netns=True)"
        _ip("link", "set", n.link, "down")
        n.frozen = True

    def heal(self, n: Node) -> None:
        assert n.link
        _ip("link", "set", n.link, "up")
        n.frozen = False

    def semaphores_refused(self) -> str | None:
        """Patroni's thread pools take POSIX semaphores (/dev/shm) as the user it runs as; a chroot or a
        minimal container whose /dev/shm is not a world-writable tmpfs refuses them, and Patroni then
        fails every failover with a PermissionError: say so at once instead."""
        r = subprocess.run(self.as_user + ["/usr/bin/python3", "-c", "import multiprocessing as m; m.Lock()"],
                           capture_output=True, text=True, timeout=30, cwd=self.dir)
        if r.returncode == 0:
            return None
        mode = oct(os.stat("/dev/shm").st_mode & 0o7777) if os.path.isdir("/dev/shm") else "missing"
        return (f"POSIX semaphores are refused to {'postgres' if self.as_user else 'this user'} (/dev/shm: {mode}, "
                f"needs a tmpfs with mode 1777; scripts/setup-system.sh, run by make test as root, mounts one): "
                f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")

    # ------------------------------------------------------------------ start / stop
    def _popen(self, cmd: list[str], log: Path, ns: NetNs | None = None) -> subprocess.Popen[bytes]:
        out = open(log, "ab")  # noqa: SIM115 - handed to the child
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PYTHON"))}
            inside = ns.enter() if ns is not None else []
            return subprocess.Popen(inside + self.as_user + cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.dir,
                                    env=env, start_new_session=True)
        finally:
            out.close()

    def start(self, timeout: float = 90.0) -> HACluster:
        etcd_dir = self.dir / "etcd"
        self.etcd = self._popen([
            "etcd", "--name", "e0", "--data-dir", str(etcd_dir),
            "--listen-client-urls", f"http://{self.etcd_host}:{self.etcd_port}",
            "--advertise-client-urls", f"http://{self.etcd_host}:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer}",
            "--initial-cluster", f"e0=http://127.0.0.1:{self.etcd_peer}",
            "--heartbeat-interval", "100", "--election-timeout", "1000", "--enable-v2=true"], self.dir / "etcd.log")
        wait_for_port(self.etcd_port, host=self.etcd_host, timeout=20)
        first, *rest = self.nodes
        self.start_node(first)
        self.wait_for(lambda: self.leader() == first.name, timeout, "the first node to lead")
        for n in rest:
            self.start_node(n)
        self.wait_for(lambda: self.sync_standby() is not None and len(self.streaming()) == len(rest), timeout,
                      "the replicas to stream and one to be the synchronous standby")
        return self

    def config(self, n: Node) -> dict[str, Any]:
        sock = self.dir / n.name
        return {
            "scope": SCOPE, "name": n.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"{n.host}:{n.api_port}", "connect_address": f"{n.host}:{n.api_port}"},
            # etcd's v2 API: Patroni 3.0.2's etcd3 client renews a leader key with an unconditional
            # put, so a leader whose Patroni was paused past its ttl overwrites the key of the node
            # promoted meanwhile (seen here: the promoted node demoted, its acknowledged commits
            # gone); the v2 client renews with compare-and-swap on its own name (prevValue)
            "etcd": {"hosts": [f"{self.etcd_host}:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": self.ttl, "loop_wait": self.loop_wait, "retry_timeout": self.retry_timeout,
                    "maximum_lag_on_failover": 1 << 20, "master_start_timeout": 0,
                    "synchronous_mode": True, "synchronous_mode_strict": True,
                    "postgresql": {"use_pg_rewind": True, "use_slots": True, "parameters": {
                        "wal_level": "replica", "hot_standby": "on", "wal_log_hints": "on",
                        "max_wal_senders": 10, "max_replication_slots": 10, "max_connections": 100,
                        "synchronous_commit": "on", "hot_standby_feedback": "on"}},
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust", f"host all all {self.subnet} trust",
                           f"host replication all {self.subnet} trust"],
            },
            "postgresql": {
                "listen": f"{n.host}:{n.pg_port}", "connect_address": f"{n.host}:{n.pg_port}",
                "data_dir": str(n.data), "bin_dir": str(PG_BIN), "pgpass": str(self.dir / f"{n.name}.pgpass"),
                "authentication": {"superuser": {"username": "postgres", "password": "postgres"},
                                   "replication": {"username": "postgres", "password": "postgres"},
                                   "rewind": {"username": "postgres", "password": "postgres"}},
                # fsync off for speed: a SIGKILL of the server keeps the OS cache; what the tests
                # check is what replication guarantees
                "parameters": {"unix_socket_directories": str(sock), "fsync": "off", "full_page_writes": "on",
                               "shared_buffers": "64MB", "jit": "off"},
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }

    def start_node(self, n: Node) -> None:
        (self.dir / n.name).mkdir(exist_ok=True)
        if self.as_user:
            shutil.chown(self.dir / n.name, "postgres", "postgres")
        cfg = self.dir / f"{n.name}.yml"
        cfg.write_text(json.dumps(self.config(n), indent=1))   # JSON is YAML
        n.proc = self._popen(["patroni", str(cfg)], n.log, n.ns)

    def stop(self, logs_to: Path | None = None) -> None:
        """Stop everything and remove the temp dir (its logs copied to ``logs_to`` first, if given)."""
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(n.proc.pid, signal.SIGCONT)
                    n.proc.terminate()
        for n in self.nodes:
            if n.proc is not None:
                try:
                    n.proc.wait(20)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(n.proc.pid, signal.SIGKILL)
                    n.proc.wait(5)
            self._kill_postmaster(n, signal.SIGKILL)
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait(5)
        self._network_down()
        if logs_to is not None:
            logs_to.mkdir(parents=True, exist_ok=True)
            for log in [*self.dir.glob("*.log"), *self.dir.glob("*.yml")]:
                with contextlib.suppress(OSError):
                    shutil.copy(log, logs_to / log.name)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ state
    def api(self, n: Node, path: str = "/patroni") -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://{n.host}:{n.api_port}{path}", timeout=2) as r:
                data = json.loads(r.read())
        except urllib.error.HTTPError as e:
            data = json.loads(e.read() or b"{}")
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def members(self) -> list[dict[str, Any]]:
        for n in self.nodes:
            if n.frozen:
                continue
            data = self.api(n, "/cluster")
            if data and "members" in data:
                return list(data["members"])
        return []

    def leader(self) -> str | None:
        for m in self.members():
            if m.get("role") == "leader" and m.get("state") == "running":
                return str(m["name"])
        return None

    def sync_standby(self) -> str | None:
        for m in self.members():
            if m.get("role") == "sync_standby" and m.get("state") in ("running", "streaming"):
                return str(m["name"])
        return None

    def streaming(self) -> list[str]:
        return [str(m["name"]) for m in self.members()
                if m.get("role") in ("replica", "sync_standby") and m.get("state") in ("running", "streaming")]

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def wait_for(self, cond: Any, timeout: float, what: str) -> float:
        """Seconds until ``cond()`` held (polled every 0.2 s); TimeoutError with the logs' ends after ``timeout``."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if cond():
                return time.monotonic() - t0
            time.sleep(0.2)
        raise TimeoutError(f"HA cluster: waited {timeout:.0f} s for {what}; members {self.members()}; "
                           f"leader log ends:\n{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {n.name}\n" + n.log.read_text(errors="replace")[-chars:] for n in self.nodes
                         if n.log.exists())

    # ------------------------------------------------------------------ URLs
    def url(self, db: str = "postgres", attrs: str = "read-write") -> str:
        """triscope's multi-host spelling: one ``host=HOST:PORT`` query parameter per server."""
        hosts = "&".join(f"host={n.host}:{n.pg_port}" for n in self.nodes)
        return f"postgresql+psycopg://postgres@/{db}?{hosts}&target_session_attrs={attrs}"

    def libpq_url(self, db: str = "postgres", attrs: str = "read-write") -> str:
        """The same as ``url()`` in libpq's own multi-host spelling (``h1:p1,h2:p2``), which triscope rewrites."""
        hosts = ",".join(f"{n.host}:{n.pg_port}" for n in self.nodes)
        return f"postgresql://postgres@{hosts}/{db}?target_session_attrs={attrs}"

    def node_url(self, n: Node, db: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@{n.host}:{n.pg_port}/{db}"

    def psql(self, n: Node, sql: str, db: str = "postgres") -> str:
        out = subprocess.run([str(PG_BIN / "psql"), "-h", n.host, "-p", str(n.pg_port), "-U", "postgres",
                              "-d", db, "-Atc", sql], check=True, capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    def create_database(self, name: str) -> str:
        leader = self.node(self.leader() or "")
        self.psql(leader, f"CREATE DATABASE {name}")
        return self.url(name)

    # ------------------------------------------------------------------ faults
    def _postmaster_pid(self, n: Node) -> int | None:
        try:
            return int((n.data / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _kill_postmaster(self, n: Node, sig: signal.Signals) -> int | None:
        pid = self._postmaster_pid(n)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pid

    def kill_leader_postgres(self) -> str:
        """SIGKILL the leader's postmaster (its backends and walsenders die with it); returns the node's name."""
        name = self.leader()
        assert name is not None, "no leader to kill"
        n = self.node(name)
        pid = self._kill_postmaster(n, signal.SIGKILL)
        assert pid is not None, f"no postmaster.pid on {name}"
        return name

    def kill_patroni(self, n: Node) -> None:
        assert n.proc is not None
        os.kill(n.proc.pid if not self.as_user else self._patroni_pid(n), signal.SIGKILL)

    def _patroni_pid(self, n: Node) -> int:
        """The Patroni process itself (under ``runuser`` when we are root)."""
        assert n.proc is not None
        out = subprocess.run(["pgrep", "-s", str(n.proc.pid), "-f", "patroni"], capture_output=True, text=True)
        pids = [int(p) for p in out.stdout.split() if int(p) != n.proc.pid]
        return pids[0] if pids else n.proc.pid

    def freeze_patroni(self, n: Node) -> None:
        os.kill(self._patroni_pid(n), signal.SIGSTOP)
        n.frozen = True

    def thaw_patroni(self, n: Node) -> None:
        os.kill(self._patroni_pid(n), signal.SIGCONT)
        n.frozen = False
