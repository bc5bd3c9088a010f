"""lockkit under ``?layout=curator`` and Apache Curator's ``InterProcessMutex`` share one lock (issue 16).

A small Java program (below) is compiled at test time with ``javac`` against Debian's Curator jars
(``libcurator-recipes-java``, installed by backends/install.sh) and driven line by line. Its name encoder is
docs/interop.md's Java reference function, so the test also checks that function against lockkit's. Both
directions, one FIFO queue of mixed waiters, czxid fencing across both, and ``lockkit status`` hashing the IP
address Curator writes into its nodes.
"""

from __future__ import annotations

import base64
import queue
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

import lockkit
from backends.servers import JAVA_DIR, ZooKeeperServer, zookeeper_classpath
from lockkit import LockTimeout
from lockkit.names import encode_name

QUIET = 1.0
CURATOR_JARS = ("curator-recipes.jar", "curator-framework.jar", "curator-client.jar", "guava.jar")
NO_LOGS = ("slf4j-log4j12.jar", "log4j-1.2.jar")
"""Left out of the program's classpath: with slf4j-nop instead, Curator and ZooKeeper log nothing."""

PROGRAM = r'''
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;

/** One Curator InterProcessMutex contender driven line by line: acquire, release, quit. */
public class CuratorContender {
    static String encodeName(String name) {
        StringBuilder out = new StringBuilder();
        for (byte raw : name.getBytes(java.nio.charset.StandardCharsets.UTF_8)) {
            int c = raw & 0xff;
            if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
                    || c == '-' || c == '_' || c == '~' || c == ':') {
                out.append((char) c);
            } else {
                out.append(String.format("%%%02X", c));
            }
        }
        return out.toString();
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0];
        String name = new String(java.util.Base64.getDecoder().decode(args[1]), StandardCharsets.UTF_8);
        CuratorFramework zk = CuratorFrameworkFactory.newClient(connect, new ExponentialBackoffRetry(100, 5));
        zk.start();
        zk.blockUntilConnected();
        String path = "/lockkit/" + encodeName(name);
        InterProcessMutex mutex = new InterProcessMutex(zk, path);
        System.out.println("ready " + path);
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.equals("acquire")) {
                mutex.acquire();
                String node = mutex.getParticipantNodes().iterator().next();  // ours: we hold the lock
                long token = zk.checkExists().forPath(node).getCzxid();
                System.out.println("held " + token + " " + node);
            } else if (line.equals("release")) {
                mutex.release();
                System.out.println("released");
            } else if (line.equals("quit")) {
                break;
            }
            System.out.flush();
        }
        zk.close();
    }
}
'''


@pytest.fixture(scope="session")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    javac = shutil.which("javac")
    assert javac, "javac is missing: run backends/install.sh (default-jdk-headless)"
    base = Path(JAVA_DIR)
    missing = [jar for jar in CURATOR_JARS if not (base / jar).is_file()]
    assert not missing, f"{missing} missing in {base}: run backends/install.sh (libcurator-recipes-java)"
    jars = [str(base / jar) for jar in CURATOR_JARS]
    jars += [jar for jar in zookeeper_classpath() if Path(jar).name not in NO_LOGS]
    if (base / "slf4j-nop.jar").is_file():
        jars.append(str(base / "slf4j-nop.jar"))
    out = tmp_path_factory.mktemp("curator")
    (out / "CuratorContender.java").write_text(PROGRAM)
    subprocess.run([javac, "-cp", ":".join(jars), "-d", str(out), str(out / "CuratorContender.java")],
                   check=True, capture_output=True, timeout=120)
    return ":".join([str(out), *jars])


class Curator:
    """One JVM with one InterProcessMutex on ``/lockkit/<encodeName(name)>``."""

    def __init__(self, classpath: str, hosts: str, name: str) -> None:
        self.proc = subprocess.Popen(
            ["java", "-Xmx64m", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData", "-cp", classpath, "CuratorContender",
             hosts, base64.b64encode(name.encode()).decode()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        ready = self._next(30)
        assert ready is not None and ready.startswith("ready "), ready
        self.path = ready.split(" ", 1)[1]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())

    def _next(self, timeout: float) -> str | None:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def _send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def acquire(self) -> None:
        """Start a blocking acquire; :meth:`granted` tells when it returned."""
        self._send("acquire")

    def granted(self, timeout: float) -> int | None:
        """The czxid of our node once the mutex is held, or None if it was not within ``timeout``."""
        line = self._next(timeout)
        if line is None:
            return None
        assert line.startswith("held "), line
        return int(line.split()[1])

    def release(self) -> None:
        self._send("release")
        assert self._next(10) == "released"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._send("quit")
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._reader.join(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def name() -> str:
    return f"interop v1.2/é {{%}}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def path(name: str) -> str:
    return "/lockkit/" + encode_name(name)


@pytest.fixture
def curator(classpath: str, zookeeper_server: ZooKeeperServer, name: str) -> Iterator[Callable[[], Curator]]:
    started: list[Curator] = []

    def start() -> Curator:
        started.append(Curator(classpath, zookeeper_server.hosts, name))
        return started[-1]

    yield start
    for proc in started:
        proc.close()


@pytest.fixture
def url(zookeeper_server: ZooKeeperServer) -> str:
    return zookeeper_server.url + "?layout=curator"


def wait_children(zk: KazooClient, path: str, n: int) -> None:
    end = time.monotonic() + 10
    while len(zk.get_children(path)) != n:
        assert time.monotonic() < end, f"expected {n} contenders under {path}"
        time.sleep(0.02)


def test_the_java_reference_encoder_agrees(curator: Callable[[], Curator], path: str) -> None:
    assert curator().path == path  # docs/interop.md's encodeName, run by the JVM, on '.', '/', space, é, {%}


def test_curator_holder_blocks_lockkit(curator: Callable[[], Curator], url: str, zookeeper_server: ZooKeeperServer,
                                       name: str) -> None:
    java = curator()
    java.acquire()
    token = java.granted(15)
    assert token is not None
    with lockkit.connect(url) as locks, lockkit.connect(zookeeper_server.url) as kazoo_layout:
        lock = locks.lock(name, ttl=5)
        assert lock.try_acquire() is None
        with pytest.raises(LockTimeout):
            lock.acquire(timeout=QUIET)
        assert kazoo_layout.lock(name).try_acquire() is None  # either layout orders Curator's nodes
        info = locks.holder(name)
        assert info.held and info.fencing_token == token
        java.release()
        lease = lock.acquire(timeout=10)
        assert lease.fencing_token > token
        lock.release()


def test_lockkit_holder_blocks_curator(curator: Callable[[], Curator], url: str, zk_raw: KazooClient, name: str,
                                       path: str) -> None:
    with lockkit.connect(url) as locks:
        lock = locks.lock(name, ttl=5)
        lease = lock.acquire(timeout=5)
        [child] = zk_raw.get_children(path)
        assert child.startswith("_c_") and "-lock-" in child  # Curator's protected name
        java = curator()
        java.acquire()
        assert java.granted(QUIET) is None
        wait_children(zk_raw, path, 2)
        lock.release()
        token = java.granted(10)
        assert token is not None and token > lease.fencing_token
        java.release()


def test_mixed_queue_is_fifo(curator: Callable[[], Curator], url: str, zk_raw: KazooClient, name: str,
                             path: str) -> None:
    """lockkit holder, then waiters Curator, lockkit, Curator, lockkit: served in exactly that order."""
    c1, c2 = curator(), curator()
    served: queue.Queue[tuple[str, int]] = queue.Queue()
    go_on = {"L1": threading.Event(), "L2": threading.Event()}
    threads: list[threading.Thread] = []

    def lockkit_waiter(locker: lockkit.Locker, label: str) -> None:
        lock = locker.lock(name, ttl=5)
        served.put((label, lock.acquire(timeout=30).fencing_token))
        go_on[label].wait(30)
        lock.release()

    with lockkit.connect(url) as a, lockkit.connect(url) as b, lockkit.connect(url) as c:
        head = a.lock(name, ttl=5)
        tokens = [head.acquire(timeout=5).fencing_token]
        try:
            c1.acquire()
            wait_children(zk_raw, path, 2)
            threads.append(threading.Thread(target=lockkit_waiter, args=(b, "L1")))
            threads[-1].start()
            wait_children(zk_raw, path, 3)
            c2.acquire()
            wait_children(zk_raw, path, 4)
            threads.append(threading.Thread(target=lockkit_waiter, args=(c, "L2")))
            threads[-1].start()
            wait_children(zk_raw, path, 5)

            head.release()
            token = c1.granted(10)
            assert token is not None, "the first waiter (Curator) was not served"
            tokens.append(token)
            assert served.empty() and c2.granted(0.3) is None
            c1.release()
            label, token = served.get(timeout=10)
            assert label == "L1"
            tokens.append(token)
            assert c2.granted(0.3) is None and served.empty()
            go_on["L1"].set()
            token = c2.granted(10)
            assert token is not None, "the third waiter (Curator) was not served"
            tokens.append(token)
            time.sleep(0.3)
            assert served.empty()
            c2.release()
            label, token = served.get(timeout=10)
            assert label == "L2"
            tokens.append(token)
            go_on["L2"].set()
            assert tokens == sorted(tokens) and len(set(tokens)) == 5, tokens
        finally:
            for event in go_on.values():
                event.set()
            for thread in threads:
                thread.join(30)


def test_status_hashes_curators_node_data(curator: Callable[[], Curator], url: str, zk_raw: KazooClient,
                                          name: str, path: str) -> None:
    java = curator()
    java.acquire()
    assert java.granted(15) is not None
    [child] = zk_raw.get_children(path)
    data = zk_raw.get(f"{path}/{child}")[0]
    assert data  # Curator's default: the client's IP address
    with lockkit.connect(url) as locks:
        hint = locks.holder(name).token_hint
    assert hint is not None and len(hint) == 8 and hint != data.decode(errors="replace")
    assert data.decode(errors="replace") not in hint
    java.release()


