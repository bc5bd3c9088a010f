"""The docs are tests: every Python, shell and TOML block of README.md and docs/ runs against real servers.

pytest-markdown-docs collects the fences (this module is loaded with ``-p tests.docs_plugin`` in pyproject.toml
and collects README.md and docs/**.md, which ``testpaths`` lists). A markdown-it rule of ours sends each fence
to one of the runners below:

- ``python``: runs as written, except that the production host names of the docs are replaced by the servers of
  this test session (``HOSTS``), in a fresh working directory with ``LOCKKIT_URL``/``LOCKKIT_CONFIG`` unset and
  ``XDG_STATE_HOME`` inside it. The placeholder functions the examples call (``read_stock()``,
  ``write_stock(…, fencing_token=…)``, ``alert(…)``) are defined here (``pytest_markdown_docs_globals``).
  Every locker the block opens with ``lockkit.connect``/``from_config`` and leaves open must reach its
  backends (``Locker.check()``); then it is closed. A ``${VAR}`` in a URL given to ``connect()`` fails the
  block: only lockkit.toml expands it, ``connect()`` would send the text.
- ``sh``: each ``lockkit …`` line runs the venv's lockkit with the same substitution, in that directory, where
  ``./lockkit.toml`` is the last lockkit.toml block above it on the page, and must exit 0. An executable
  ``./report.sh`` is there for the examples (it fails unless ``LOCKKIT_FENCING_TOKEN`` is set). Subcommands
  that run for a while get shorter runs appended (``FAST``). ``etcdctl …`` lines run against a fresh etcd
  (the password prompts read ``PASSWORD``). Any other command (``make``, ``sudo``, ``pip install``, …)
  fails the test: such a block must carry a skip directive.
- ``toml``: a lockkit.toml (one with ``backends``) is opened with ``lockkit.from_config`` on the parsed and
  substituted mapping, and each backend must be reachable; a pyproject.toml fragment must register drivers
  under lockkit's entry-point group.
- Credentials: every ``*_PASSWORD`` variable is ``PASSWORD``, and the session's Redis has a user ``app`` with
  it (the examples' user), so the examples' logins are really made. The Sentinel set's master and replicas and
  every node of the Redis Cluster have that user too, and the sentinels the page's ``lockkit-sentinel`` user
  with its ACL rule as written (``doc_acl_rule``); a literal ``PASSWORD`` in a URL (``app:PASSWORD@``,
  ``sentinel_password=PASSWORD``: the Redis page's placeholder) is replaced by it. The PostgreSQL server has the
  page's role ``locker`` with the page's password ``PG_PASSWORD`` (also in ``PGPASSWORD``, for the URL that
  leaves it to libpq) and a database ``orders`` it may create its tables in.
- Other fences (``sql``, and fences without a language: output, key layouts, ACL rules) are not run.

Directives, an HTML comment right before a fence (invisible where the Markdown is rendered):

- ``<!-- doc-test: skip REASON -->``: the block is not run; the test is reported skipped with REASON
  (required). A bare ``notest`` in the info string is refused: say why.
- ``<!-- doc-test: config PATH -->`` (sh): ``./lockkit.toml`` is instead the first lockkit.toml block of PATH.
- ``<!-- doc-test: offline REASON -->`` (python): the lockers are opened (URLs, options and files checked) but
  their backends are not reached.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from backends.servers import PostgresServer

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

pytest_plugins = ["backends.pytest_fixtures"]  # the session's servers, also when only the docs are collected

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "doc-test-secret"
"""Every ``*_PASSWORD`` variable of the examples (and etcdctl's password prompts) gets this value."""
PG_PASSWORD = "p@ss/word"
"""The PostgreSQL page's password of its role ``locker`` (it shows how to percent-encode one like it)."""
PYTHON_LANGS = {"python", "py", "python3"}
SHELL_LANGS = {"sh", "shell", "bash", "console"}
DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:\s*(\S+)\s*(.*?)\s*-->\s*$", re.S)

# Production host names of the docs -> the session server that stands in for them.
HOSTS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b(?:localhost|cache):6379\b"), "redis"),
    (re.compile(r"\br[1-9]:6379(?:,r[1-9]:6379)*"), "redlock"),
    (re.compile(r"\betcd-[1-9]:2379(?:,etcd-[1-9]:2379)*"), "etcd"),
    (re.compile(r"\bzk-?[1-9]:2181(?:,zk-?[1-9]:2181)*"), "zookeeper"),
    (re.compile(r"\bsentinel-[1-9]:26379(?:,sentinel-[1-9]:26379)*"), "sentinel"),
    (re.compile(r"\bredis-[1-9]:6379(?:,redis-[1-9]:6379)*"), "cluster"),
    (re.compile(r"\bdb-1:5432\b"), "postgres"),
]
# The password placeholder of the Redis page's URLs -> the session's password.
PLACEHOLDERS = re.compile(r"(?<=:)PASSWORD(?=@)|(?<=_password=)PASSWORD\b")
# Paths of the examples -> where they point in the test (the working directory, the system's CA bundle).
PATHS: list[tuple[re.Pattern[str], Callable[[DocsEnv], str]]] = [
    (re.compile(r"(?<=file://)/var/lib/"), lambda env: f"{env.cwd}/var/lib/"),
    (re.compile(r"/etc/ssl/etcd-ca\.pem"), lambda env: "/etc/ssl/certs/ca-certificates.crt"),
]
# Appended to these subcommands so that the doc run stays short (argparse: the last value wins).
FAST = {
    "demo": ["--workers", "3", "--deductions", "150"],
    "verify": ["--processes", "3", "--duration", "5"],
    "bench": ["--rounds", "20", "--processes", "2", "--seconds", "1", "--renew-locks", "20", "--renew-seconds", "1"],
}
REPORT_SH = '#!/bin/sh\n# the docs\' example job: it runs under the lock\ntest -n "$LOCKKIT_FENCING_TOKEN"\n'


# ------------------------------------------------------------------------------------------------ collection


def _is_doc(path: Path) -> bool:
    return path.suffix == ".md" and (path == ROOT / "README.md" or (ROOT / "docs") in path.parents)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if parent.config.option.markdowndocs or not _is_doc(Path(file_path)):
        return None  # --markdown-docs: the plugin collects by itself
    try:
        from pytest_markdown_docs.plugin import MarkdownTextFile
    except ImportError as exc:
        raise pytest.UsageError("the doc tests need pytest-markdown-docs: .venv/bin/pip install -e '.[dev]'") from exc

    return MarkdownTextFile.from_parent(parent, path=Path(file_path))


def _route(state: Any) -> None:
    """markdown-it core rule: send every fence to our runners, with its directive (the HTML comment above it)."""
    tokens = state.tokens
    for i, token in enumerate(tokens):
        if token.type != "fence":
            continue
        words = token.info.split()
        lang = words[0].lower() if words else ""
        directive, argument = "", ""
        if i and tokens[i - 1].type == "html_block" and (m := DIRECTIVE.match(tokens[i - 1].content)):
            directive, argument = m.group(1), m.group(2)
        if "notest" in words[1:]:
            directive, argument = "skip", ""
        runner = (
            "DocsPython" if lang in PYTHON_LANGS else
            "DocsShell" if lang in SHELL_LANGS else
            "DocsToml" if lang == "toml" else None
        )
        if runner is None:
            continue  # not code we run (sql, output, plain text)
        if directive == "skip":
            where = f"line {token.map[0] + 1}" if token.map else "a fence"
            token.content = argument or f"!{where}: give the reason: <!-- doc-test: skip REASON -->"
            token.info = "python runner:DocsSkip"
            continue
        keep = " continuation" if "continuation" in words[1:] else ""
        token.info = f"python runner:{runner} fixture:docs_env{keep}"
        if directive:
            # a trailing comment line, valid in all three languages; the runner reads it back
            token.content += f"# doc-test: {directive} {argument}\n"


@pytest.hookimpl(tryfirst=True)
def pytest_markdown_docs_markdown_it() -> Any:
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark")
    parser.core.ruler.push("lockkit_docs_route", _route)
    return parser


def _directives(source: str) -> dict[str, str]:
    return dict(
        (m.group(1), m.group(2).strip()) for m in re.finditer(r"^# doc-test: (\S+) ?(.*)$", source, re.M)
    )


# ------------------------------------------------------------------------------------------ the examples' world


class Stock:
    """The examples' storage: one record that refuses writes with a stale fencing token."""

    def __init__(self, value: int = 100) -> None:
        self.value = value
        self.fence = 0
        self.writes: list[tuple[int, int]] = []

    def read(self) -> int:
        return self.value

    def write(self, value: int, *, fencing_token: int) -> None:
        if not isinstance(fencing_token, int) or fencing_token < self.fence:
            raise RuntimeError(f"stale write refused: fencing token {fencing_token!r} < {self.fence}")
        self.value, self.fence = value, fencing_token
        self.writes.append((value, fencing_token))


def pytest_markdown_docs_globals() -> dict[str, Any]:
    import lockkit

    stock = Stock()
    alerts: list[str] = []
    return {
        "lockkit": lockkit,  # the backend pages' snippets leave out `import lockkit`
        "read_stock": stock.read,
        "write_stock": stock.write,
        "alert": alerts.append,
    }


@dataclasses.dataclass
class DocsEnv:
    """What a doc block runs in: a working directory, an environment, and servers started on first mention."""

    request: pytest.FixtureRequest
    cwd: Path
    env: dict[str, str]
    lockers: list[Any] = dataclasses.field(default_factory=list)
    etcdctl_endpoint: str | None = None

    def server(self, kind: str) -> str:
        """``host:port[,host:port…]`` of the session's server standing in for ``kind``."""
        if kind == "redis":
            s = self.request.getfixturevalue("redis_server")
            _redis_user(s.host, s.port)
            return f"{s.host}:{s.port}"
        if kind == "redlock":
            group = self.request.getfixturevalue("redlock_servers")
            return ",".join(f"{s.host}:{s.port}" for s in group.servers)
        if kind == "etcd":
            return str(self.request.getfixturevalue("etcd_server").endpoint)
        if kind == "zookeeper":
            return str(self.request.getfixturevalue("zookeeper_server").hosts)
        if kind == "sentinel":
            sentinels = self.request.getfixturevalue("sentinel_set")
            for server in sentinels.redis:  # ACL users are not replicated: the same login on every one
                _redis_user(server.host, server.port)
            rule = doc_acl_rule("lockkit-sentinel")  # the page's rule as written: the example checks it
            for sentinel in sentinels.sentinels:
                sentinel.ask("ACL", "SETUSER", "lockkit-sentinel", "reset", f">{PASSWORD}", *rule)
            return ",".join(f"{s.host}:{s.port}" for s in sentinels.sentinels)
        if kind == "cluster":
            cluster = self.request.getfixturevalue("redis_cluster")
            for node in cluster.members:  # a cluster does not share ACL users either
                _redis_user(node.host, node.port)
            return ",".join(f"{n.host}:{n.port}" for n in cluster.members)
        if kind == "postgres":
            s = self.request.getfixturevalue("postgres_server")
            _postgres_role(s)
            return f"{s.host}:{s.port}"
        raise KeyError(kind)

    def substitute(self, text: str) -> str:
        for pattern, kind in HOSTS:
            if pattern.search(text):
                text = pattern.sub(self.server(kind), text)
        for pattern, replace in PATHS:
            text = pattern.sub(replace(self), text)
        return PLACEHOLDERS.sub(PASSWORD, text)

    def check_lockers(self, reach: bool) -> None:
        """Every locker the block opened and left open reaches its backends; all are closed after."""
        import lockkit

        problems: list[str] = []
        try:
            for locker in self.lockers:
                if getattr(locker, "_closed", False) or not isinstance(locker, lockkit.Locker):
                    continue  # closed by the block itself, or an AsyncLocker (the block awaits its own)
                if reach:
                    problems += [f"{name}: {r}" for name, r in locker.check().items() if not isinstance(r, float)]
        finally:
            for locker in self.lockers:
                if isinstance(locker, lockkit.Locker):
                    locker.close()
        assert not problems, "the block's lockers cannot reach their backends: " + "; ".join(problems)


@pytest.fixture
def docs_env(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DocsEnv]:
    import lockkit

    monkeypatch.chdir(tmp_path)
    for var in ("LOCKKIT_URL", "LOCKKIT_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for var in ("REDIS_PASSWORD", "ETCD_PASSWORD", "ZK_PASSWORD", "PW"):
        monkeypatch.setenv(var, PASSWORD)
    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    report = tmp_path / "report.sh"
    report.write_text(REPORT_SH)
    report.chmod(0o755)
    env = DocsEnv(request, tmp_path, dict(os.environ))
    for name in ("connect", "connect_async", "from_config", "from_config_async"):
        opener = getattr(lockkit, name)

        def tracked(*args: Any, _open: Callable[..., Any] = opener, **kwargs: Any) -> Any:
            url = args[0] if args else kwargs.get("url")
            if isinstance(url, str) and re.search(r"\$\{\w+\}", url):
                raise AssertionError(
                    f"{url}: connect() takes the URL as it is and would send the literal ${{…}} text; only "
                    "lockkit.toml expands ${VAR} (show the toml form, or build the URL from os.environ)"
                )
            locker = _open(*args, **kwargs)
            env.lockers.append(locker)
            return locker

        monkeypatch.setattr(lockkit, name, tracked)
    try:
        yield env
    finally:
        for locker in env.lockers:
            if isinstance(locker, lockkit.Locker):
                locker.close()


# ------------------------------------------------------------------------------------------------- runners


def _runners() -> Any:
    from pytest_markdown_docs._runners import DefaultRunner, register_runner

    @register_runner()
    class DocsSkip(DefaultRunner):
        def runtest(self, test: Any, args: dict[str, Any], **_: Any) -> None:
            reason = test.source.strip()
            if reason.startswith("!"):
                pytest.fail(f"{test.source_path} {reason[1:]}", pytrace=False)
            raise pytest.skip.Exception(reason, _use_item_location=True)  # reported at the doc's line

    @register_runner()
    class DocsPython(DefaultRunner):
        def runtest(self, test: Any, args: dict[str, Any], **kwargs: Any) -> None:
            env: DocsEnv = args["docs_env"]
            directives = _directives(test.source)
            source = env.substitute(test.source)
            super().runtest(dataclasses.replace(test, source=source), args, **kwargs)
            env.check_lockers(reach="offline" not in directives)

    @register_runner()
    class DocsShell(DefaultRunner):
        def runtest(self, test: Any, args: dict[str, Any], **_: Any) -> None:
            env: DocsEnv = args["docs_env"]
            directives = _directives(test.source)
            config = _page_config(Path(test.source_path), test.start_line, directives.get("config"))
            if config is not None:
                (env.cwd / "lockkit.toml").write_text(env.substitute(config))
            lines = _shell_lines(test.source)
            assert lines, "a shell block with no command"
            for lineno, line in lines:
                _run_shell_line(env, test.source_path, lineno, line)

    @register_runner()
    class DocsToml(DefaultRunner):
        def runtest(self, test: Any, args: dict[str, Any], **_: Any) -> None:
            env: DocsEnv = args["docs_env"]
            data = tomllib.loads(test.source)  # a syntax error fails here, with its line
            if "project" in data:
                _check_pyproject(data)
                return
            import lockkit

            mapping = tomllib.loads(env.substitute(test.source))
            with lockkit.from_config(mapping) as locks:
                shown = locks.describe()
                problems = [
                    f"{name} ({shown[name]}): {result}"
                    for name, result in locks.check().items()
                    if not isinstance(result, float)
                ]
            assert not problems, "backends of this lockkit.toml are unreachable: " + "; ".join(problems)

    return DocsPython


def _redis_user(host: str, port: int) -> None:
    """The examples' Redis user ``app`` (password ``PASSWORD``), so that their credentials are really checked."""
    import redis

    with redis.Redis(host=host, port=port) as client:
        client.execute_command("ACL", "SETUSER", "app", "on", f">{PASSWORD}", "~*", "&*", "+@all")


def doc_acl_rule(user: str, page: str = "docs/backends/redis.md") -> list[str]:
    """The ACL rule ``page`` gives ``user`` (``ACL SETUSER USER on >PASSWORD …``), as written, without the password."""
    m = re.search(rf"^ACL SETUSER {re.escape(user)} (.*?) >PASSWORD (.*)$", (ROOT / page).read_text(), re.M)
    assert m, f"{page} has no 'ACL SETUSER {user} … >PASSWORD …' line"
    return [*m.group(1).split(), *m.group(2).split()]


def _postgres_role(server: PostgresServer) -> None:
    """The PostgreSQL page's role ``locker`` (password ``PG_PASSWORD``) and its database ``orders``, with the rights
    of the page's "The role's rights" (the variant that lets lockkit create its tables)."""
    if server.psql("SELECT 1 FROM pg_database WHERE datname = 'orders'") != "1":
        server.psql("CREATE DATABASE orders")
    if server.psql("SELECT 1 FROM pg_roles WHERE rolname = 'locker'") != "1":
        server.psql("CREATE ROLE locker")
    server.psql(f"ALTER ROLE locker LOGIN PASSWORD '{PG_PASSWORD}'")
    server.psql(
        "GRANT CONNECT ON DATABASE orders TO locker; GRANT USAGE, CREATE ON SCHEMA public TO locker", database="orders"
    )


def _check_pyproject(data: dict[str, Any]) -> None:
    groups = data["project"].get("entry-points", {})
    assert groups, "a pyproject.toml fragment without entry points"
    assert set(groups) == {"lockkit.drivers"}, f"lockkit looks up drivers under 'lockkit.drivers', not {set(groups)}"
    for scheme, target in groups["lockkit.drivers"].items():
        assert re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme), f"{scheme!r} is not a URL scheme"
        assert re.fullmatch(r"[\w.]+:[\w.]+", target), f"{target!r} is not 'module:Class'"


def _page_config(page: Path, start_line: int, named: str | None) -> str | None:
    """The lockkit.toml a shell block runs with: the first of ``named``, else the last one above the block."""
    from markdown_it import MarkdownIt

    source = ROOT / named if named else page
    blocks = [
        (t.map[0] if t.map else 0, t.content)
        for t in MarkdownIt("commonmark").parse(source.read_text())
        if t.type == "fence" and t.info.split()[:1] == ["toml"] and "backends" in tomllib.loads(t.content)
    ]
    if named:
        assert blocks, f"{named} has no lockkit.toml block"
        return blocks[0][1]
    above = [content for line, content in blocks if line < start_line]
    return above[-1] if above else None


def _shell_lines(source: str) -> list[tuple[int, str]]:
    """(line number, command) of each command of a block; backslash continuations joined, comments dropped."""
    lines: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for lineno, raw in enumerate(source.splitlines(), start=1):
        text = raw.strip()
        if text.startswith("# doc-test:"):
            continue
        if pending is not None:
            start, text = pending[0], pending[1] + " " + text
            pending = None
        else:
            start = lineno
        if text.endswith("\\"):
            pending = (start, text[:-1])
            continue
        text = text.removeprefix("$ ")
        if shlex.split(text, comments=True):
            lines.append((start, text))
    return lines


def _run_shell_line(env: DocsEnv, path: Path, lineno: int, line: str) -> None:
    shown = Path(path).relative_to(ROOT) if ROOT in Path(path).parents else path
    where = f"{shown}:{lineno}: {line}"
    argv = shlex.split(env.substitute(line), comments=True)
    stdin = None
    run_env = dict(os.environ)
    if argv[0] == "lockkit":
        argv[0] = str(Path(sys.executable).with_name("lockkit"))
        sub = next((a for a in argv[1:] if not a.startswith("-")), "")
        argv += FAST.get(sub, [])
    elif argv[0] == "etcdctl":
        if env.etcdctl_endpoint is None:  # a fresh etcd: the examples create users and roles
            env.etcdctl_endpoint = env.request.getfixturevalue("fresh_etcd")().endpoint
        run_env.update(ETCDCTL_API="3", ETCDCTL_ENDPOINTS=env.etcdctl_endpoint)
        stdin = f"{PASSWORD}\n{PASSWORD}\n"
    else:
        raise AssertionError(
            f"{where}\nthe doc run runs only lockkit and etcdctl commands; "
            "mark set-up blocks (make, sudo, pip install, …) with <!-- doc-test: skip REASON -->"
        )
    done = subprocess.run(argv, cwd=env.cwd, env=run_env, input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (
        f"{where}\nexited {done.returncode} (the docs promise 0)\n"
        f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )


with contextlib.suppress(ImportError):  # an old venv: only the doc files fail to collect, saying how to fix it
    _runners()
