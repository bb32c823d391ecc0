#!/usr/bin/env python3
"""A one-machine SLURM cluster with accounting, to try `hydra/launcher=slurm` here and to test it.

    tools/slurm_cluster.py up [--dir DIR]     # start; prints `export SLURM_CONF=DIR/etc/slurm.conf`
                                                # (--max-array-size N: the cluster's MaxArraySize, default 1001)
    tools/slurm_cluster.py down [--dir DIR]   # cancel its jobs, stop exactly the daemons it started (by pid)
    tools/slurm_cluster.py check              # exit 2 with a one-line reason when it cannot run here
    tools/slurm_cluster.py install            # root: apt-get the Debian packages, quietly (idempotent)

Debian's SLURM 22.05 (`slurmctld`, `slurmd`, `slurm-client`, `slurmdbd`) with `munge` and MariaDB: munged,
mariadbd, slurmdbd, slurmctld and slurmd, each run in the foreground of its own session by this script, on
free unprivileged ports of 127.0.0.1. One node with this machine's CPUs (proctrack/linuxproc, task/none, no
cgroups), accounting in slurmdbd (so `sacct` works: submitit polls it). Config, state, database and logs all
live in DIR (default: one directory per checkout under $TMPDIR); nothing under /etc or /run is touched. The
daemons' pids are in DIR/pids.json; a start that fails stops what it had started. Standard library only (it
runs before .venv exists).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "mariadb-server")
PROGRAMS = {"munged": "munge", "mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server",
            "mariadb": "mariadb-server", "slurmdbd": "slurmdbd", "slurmctld": "slurmctld", "slurmd": "slurmd",
            "sbatch": "slurm-client", "sacct": "slurm-client", "sacctmgr": "slurm-client", "scontrol": "slurm-client"}
SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
MARKER = "ERASURE_MDL_SLURM_DIR"  # in the environment of every daemon started here (and of their slurmstepds)
START_TIMEOUT_S = 60.0
REQUEUE_DELAY_S = 10  # slurm.conf AuthInfo cred_expire (default 120 s): how long a requeued job waits to restart


class StartError(RuntimeError):
    """A daemon did not come up; the message says which and where its log is."""


def default_dir() -> Path:
    """One cluster directory per checkout, so `make slurm-down` finds what `make slurm-up` started."""
    repo = Path(__file__).resolve().parents[1]
    tag = hashlib.sha256(str(repo).encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / f"erasure-mdl-slurm-{os.getuid()}-{tag}"


def which(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def why_not() -> str | None:
    """Why a cluster cannot be started here (one line), or None."""
    if not sys.platform.startswith("linux"):
        return "SLURM cluster needs Linux"
    missing = sorted({pkg for prog, pkg in PROGRAMS.items() if which(prog) is None})
    if os.geteuid() != 0:
        return "SLURM cluster needs root (its daemons run as root)" + (
            f"; packages missing too: {' '.join(missing)}" if missing else "")
    if missing:
        how = "run `tools/slurm_cluster.py install`" if which("apt-get") else "no apt-get here to install them"
        return f"SLURM cluster needs Debian packages {' '.join(missing)}: {how}"
    return None


def install() -> int:
    """apt-get the packages when some are missing (root + apt only); quiet unless it fails."""
    if all(which(p) for p in PROGRAMS):
        return 0
    if os.geteuid() != 0 or which("apt-get") is None:
        print(f"slurm_cluster: cannot install {' '.join(PACKAGES)} (needs root and apt-get)", file=sys.stderr)
        return 2
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    for attempt in (cmd, ["apt-get", "update", "-q"], cmd):
        proc = subprocess.run(attempt, env=env, capture_output=True, text=True)
        if proc.returncode == 0 and attempt is cmd:
            return 0
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["?"]
    print(f"slurm_cluster: apt-get install {' '.join(PACKAGES)} failed: {tail[0]}", file=sys.stderr)
    return 1


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Cluster:
    def __init__(self, root: Path, max_array_size: int | None = None) -> None:
        self.root = root.resolve()
        self.max_array_size = max_array_size
        self.etc, self.log, self.run = self.root / "etc", self.root / "log", self.root / "run"
        self.conf = self.etc / "slurm.conf"
        self.pids_file = self.root / "pids.json"
        self.munge_socket = self.run / "munge.socket"
        self.db_socket = self.run / "mariadb.sock"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), MARKER: str(self.root)}

    # --- bookkeeping ------------------------------------------------------------------------------------
    def pids(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in json.loads(self.pids_file.read_text()).items()}
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def client(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)

    def spawn(self, name: str, argv: list[str], ready: Callable[[], bool]) -> None:
        """Start a daemon in the foreground of its own session (it outlives this script), record its pid and wait
        until it is `ready` (a StartError naming its log when it exits or is not ready in time)."""
        with (self.log / f"{name}.out").open("ab") as out:
            proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        tmp = self.pids_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({**self.pids(), name: proc.pid}))
        tmp.replace(self.pids_file)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if proc.poll() is not None:
                raise StartError(f"{name} exited with status {proc.returncode}; see {self.log / name}.log")
            if time.monotonic() > deadline:
                raise StartError(f"{name} not ready after {START_TIMEOUT_S:.0f}s; see {self.log / name}.log")
            time.sleep(0.2)

    # --- start ------------------------------------------------------------------------------------------
    def write_config(self) -> dict[str, int | str]:
        for d in (self.etc, self.log, self.run, self.root / "munge", self.root / "state/ctld",
                  self.root / "state/slurmd"):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        os.chmod(self.root / "munge", 0o700)
        ctld, slurmd, dbd, db = free_ports(4)
        host = socket.gethostname().split(".")[0]
        name = f"emdl{secrets.token_hex(3)}"  # clusters of other checkouts on this machine get other names
        cpus = os.cpu_count() or 1
        mem_mb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                          if line.startswith("MemTotal:"))) // 1024 * 9 // 10
        password = secrets.token_hex(12)
        r = self.root
        # AccountingStoragePass=socket=...: clients reach slurmdbd with this munge socket (not AuthInfo's)
        self.conf.write_text(f"""# written by tools/slurm_cluster.py: a one-node cluster, everything under {r}
ClusterName={name}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket},cred_expire={REQUEUE_DELAY_S}
CredType=cred/munge
MailProg=/bin/true
StateSaveLocation={r}/state/ctld
SlurmdSpoolDir={r}/state/slurmd
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
PlugStackConfig={r}/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={dbd}
AccountingStoragePass=socket={self.munge_socket}
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_interval=2,bf_interval=2
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
SlurmctldDebug=info
SlurmdDebug=info
NodeName={name}n1 NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes={name}n1 Default=YES MaxTime=INFINITE State=UP
""" + (f"MaxArraySize={self.max_array_size}\n" if self.max_array_size else ""))
        (self.etc / "plugstack.conf").write_text("")
        dbd_conf = self.etc / "slurmdbd.conf"
        dbd_conf.write_text(f"""AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
DbdHost={host}
DbdAddr=127.0.0.1
DbdPort={dbd}
SlurmUser=root
PidFile={r}/run/slurmdbd.pid
LogFile={r}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db}
StorageUser=slurm
StoragePass={password}
StorageLoc=slurm_acct_db
""")
        os.chmod(dbd_conf, 0o600)  # slurmdbd refuses a readable one (it holds the password)
        info: dict[str, int | str] = {"cluster": name, "node": f"{name}n1", "slurmctld_port": ctld,
                                      "slurmd_port": slurmd, "slurmdbd_port": dbd, "mariadb_port": db,
                                      "db_password": password}
        (self.root / "cluster.json").write_text(json.dumps(info, indent=1))
        return info

    def start(self) -> None:
        info = self.write_config()
        # munge: a fresh key; clients find the socket through AuthInfo in slurm.conf / slurmdbd.conf
        key = self.root / "munge/munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        self.spawn("munged", [str(which("munged")), "--foreground", "--force", f"--socket={self.munge_socket}",
                              f"--key-file={key}", f"--pid-file={self.run / 'munged.pid'}",
                              f"--log-file={self.log / 'munged.log'}", f"--seed-file={self.root / 'munge/seed'}"],
                   lambda: self.munge_socket.exists()
                   and self.client("munge", "-n", f"--socket={self.munge_socket}").returncode == 0)

        datadir, tmpdir = self.root / "db", self.root / "db-tmp"
        tmpdir.mkdir(exist_ok=True)  # not /tmp: two clusters installing at once lost each other's temporary tables
        db_opts = [f"--datadir={datadir}", f"--tmpdir={tmpdir}", "--user=root", "--innodb-log-file-size=4M",
                   "--innodb-buffer-pool-size=32M"]
        proc = self.client(str(which("mariadb-install-db")), "--no-defaults", *db_opts, "--skip-test-db",
                           "--auth-root-authentication-method=socket", timeout=120)
        if proc.returncode != 0:
            (self.log / "mariadb-install-db.log").write_text(proc.stdout + proc.stderr)
            raise StartError(f"mariadb-install-db failed; see {self.log / 'mariadb-install-db.log'}")
        self.spawn("mariadbd", [str(which("mariadbd")), "--no-defaults", *db_opts, f"--socket={self.db_socket}",
                                f"--port={info['mariadb_port']}", "--bind-address=127.0.0.1", "--skip-name-resolve",
                                f"--pid-file={self.run / 'mariadbd.pid'}", f"--log-error={self.log / 'mariadbd.log'}"],
                   lambda: port_open(int(info["mariadb_port"])))
        sql = (f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{info['db_password']}'; "
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        proc = self.client(str(which("mariadb")), "--no-defaults", f"--socket={self.db_socket}", "-u", "root",
                           "-e", sql)
        if proc.returncode != 0:
            raise StartError(f"could not create the slurm database user: {proc.stderr.strip()}")

        self.spawn("slurmdbd", [str(which("slurmdbd")), "-D"], lambda: port_open(int(info["slurmdbd_port"])))
        deadline = time.monotonic() + START_TIMEOUT_S
        while (proc := self.client("sacctmgr", "-i", "add", "cluster", str(info["cluster"]))).returncode != 0:
            if time.monotonic() > deadline:
                raise StartError(f"sacctmgr add cluster failed: {proc.stderr.strip()}; see {self.log}/slurmdbd.log")
            time.sleep(0.5)

        self.spawn("slurmctld", [str(which("slurmctld")), "-D", "-i"],
                   lambda: "UP" in self.client("scontrol", "ping").stdout)
        self.spawn("slurmd", [str(which("slurmd")), "-D", "-N", str(info["node"])],
                   lambda: self.client("sinfo", "-h", "-N", "-o", "%T").stdout.strip() == "idle")

    # --- stop -------------------------------------------------------------------------------------------
    def cancel_jobs(self, timeout: float = 45) -> None:
        """scancel every job of this cluster and wait until the queue is empty (their steps end cleanly)."""
        if "slurmctld" not in self.pids() or not _alive(self.pids()["slurmctld"]):
            return
        try:
            jobs = self.client("squeue", "-h", "-o", "%A", timeout=10).stdout.split()
            if not jobs:
                return
            self.client("scancel", *sorted(set(jobs)), timeout=10)
            deadline = time.monotonic() + timeout
            while self.client("squeue", "-h", "-o", "%A", timeout=10).stdout.strip():
                if time.monotonic() > deadline:
                    return
                time.sleep(0.5)
        except subprocess.TimeoutExpired:
            return

    def leftovers(self) -> list[int]:
        """Processes this cluster left: slurmstepds (they carry the daemons' MARKER) and job processes (they
        carry this cluster's SLURM_CONF and a SLURM_JOB_ID); never this process or its ancestors."""
        mine, pid = {os.getpid()}, os.getpid()
        while pid > 1 and (stat := _stat(pid)):
            pid = int(stat[1])  # the parent
            mine.add(pid)
        marker = f"{MARKER}={self.root}".encode()
        conf = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in mine:
                continue
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in env or (conf in env and any(v.startswith(b"SLURM_JOB_ID=") for v in env)):
                found.append(int(entry.name))
        return found

    def stop(self) -> list[str]:
        """Stop what `start` started, newest first, each by its recorded pid; then any leftover step/job."""
        self.cancel_jobs()
        stopped = []
        for name, pid in reversed(list(self.pids().items())):
            if _belongs(pid, self.root):
                _terminate([pid])
                stopped.append(name)
        _terminate(self.leftovers())
        self.pids_file.unlink(missing_ok=True)
        return stopped


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name (state, parent, ...); empty when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return bool(stat) and stat[0] != "Z"  # a zombie has exited


def _belongs(pid: int, root: Path) -> bool:
    """The pid is still one of our daemons (not a recycled pid): it carries our marker."""
    try:
        return f"{MARKER}={root}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _terminate(pids: list[int], grace_s: float = 20) -> None:
    """TERM, up to `grace_s` to end, then KILL for those still alive."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in filter(_alive, pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["up", "down", "check", "install"])
    ap.add_argument("--dir", type=Path, default=None, help=f"cluster directory (default {default_dir()})")
    ap.add_argument("--keep-logs", action="store_true", help="down: keep DIR/log (the rest of DIR is removed)")
    ap.add_argument("--max-array-size", type=int, default=None, help="up: the cluster's MaxArraySize (the largest "
                    "job array is this many tasks; SLURM's default 1001)")
    args = ap.parse_args(argv)
    if args.action == "install":
        return install()
    if args.action == "check":
        if reason := why_not():
            print(reason)
        return 2 if reason else 0
    cluster = Cluster(args.dir or default_dir(), args.max_array_size)
    if args.action == "down":
        stopped = cluster.stop()
        if cluster.root.exists():
            for child in cluster.root.iterdir():
                if not (args.keep_logs and child.name == "log"):
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
            if not args.keep_logs:
                cluster.root.rmdir()
        print(f"slurm cluster in {cluster.root} stopped ({', '.join(stopped) or 'nothing was running'})")
        return 0
    if (reason := why_not()) is not None:
        print(reason, file=sys.stderr)
        return 2
    if cluster.pids() and any(_belongs(p, cluster.root) for p in cluster.pids().values()):
        print(f"slurm_cluster: a cluster is already running in {cluster.root}; `make slurm-down` first",
              file=sys.stderr)
        return 1
    t0 = time.monotonic()
    try:
        cluster.start()
    except (StartError, OSError, subprocess.SubprocessError) as e:
        cluster.stop()
        print(f"slurm_cluster: start failed, stopped what had started: {e}", file=sys.stderr)
        return 1
    except BaseException:
        cluster.stop()
        raise
    print(f"slurm cluster up in {time.monotonic() - t0:.1f}s (state, config and logs in {cluster.root})")
    print(f"export SLURM_CONF={cluster.conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
