"""Stack environments: a stack's CPU lock, built once, shared.

In the embedded default (and on a host's agent's process runtime) a notebook runs
in a Python environment made from its stack's CPU lock: every package from the
lock, each checked against its hash, nothing resolved. The first start on a stack
builds it (a minute or two, with progress on the spawn page); every later start,
by anyone, finds it ready. Environments are named by everything they are made
from (:func:`environment_key`), so a changed lock, common file or client is a new
environment, never an upgrade in place.

:class:`StackEnvironments` names environments and builds them in the process that
asks; that is the builder child (:mod:`.stack_builder`), which the hub and the
agent start as the build account (:mod:`.stack_builds`, :mod:`.local_stacks`).

pip installs, so the machine's own package-index settings (pip.conf, ``PIP_*``)
apply: a campus mirror works as it does for everything else.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from composespawner import client
from composespawner.domain.catalog import Stack
from composespawner.launchers.agent_protocol import FILE_NAME

BUILD_TIMEOUT = 1800.0  # seconds; a cold build here takes a minute or two
MANIFEST = "stack-manifest.json"  # written last: an environment without it is unfinished
Progress = Callable[[str, int], None]  # message, percent
_PIP_FILE_LINES = ("Collecting ", "Processing ", "Obtaining ")
# composespawner's notebook side, standard library only: in every stack, so that
# ``from composespawner import client`` works in any kernel (the hub's package is not there).
CLIENT = Path(client.__file__)
# The JupyterLab extension (composespawner-lab), built by `make labextension` in this
# checkout: its server side goes to site-packages, its prebuilt frontend to the env's
# share/jupyter/labextensions, and a config file switches the server side on.
LAB_PACKAGE = CLIENT.parents[1] / "labextension" / "composespawner_lab"
LAB_EXTENSION = "composespawner-lab"
LAB_SERVER_CONFIG = b'{"ServerApp": {"jpserver_extensions": {"composespawner_lab": true}}}\n'


def default_root() -> Path:
    """Where environments go unless configured: readable by notebook accounts when root."""
    if os.geteuid() == 0:
        return Path("/var/cache/composespawner/stacks")
    return Path.home() / ".cache" / "composespawner" / "stacks"


class StackBuildError(Exception):
    """A stack's environment could not be built; the message says what to do."""


@dataclass(frozen=True, slots=True)
class StackEnvironment:
    stack: Stack
    path: Path

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    @property
    def manifest(self) -> Path:
        return self.path / MANIFEST


def lock_hash(lock: Path) -> str:
    return hashlib.sha256(lock.read_bytes()).hexdigest()


def environment_key(
    lock_sha256: str, python_version: str, common_sha256: str, notebook_sha256: str
) -> str:
    """Everything an environment is made from, as a short hash: the lock, the Python, the
    stack's common files (``stack_manifest.py`` runs in the build; a changed one with the
    same lock is a new environment, never the old one reused, nor one it made), and the
    notebook side put in with it (:func:`notebook_side_sha256`).

    An environment is never changed once built: its builder may have left links in it
    that a later writer would follow, so a newer client is a new environment too.
    """
    made_from = f"{lock_sha256} {python_version} {common_sha256} {notebook_sha256}"
    return hashlib.sha256(made_from.encode()).hexdigest()[:16]


@functools.cache
def notebook_side_sha256(package: Path = LAB_PACKAGE) -> str:
    """One hash of what :meth:`StackEnvironments._add_notebook_side` puts in beside the
    lock: composespawner's client and the JupyterLab extension as built (or its absence).
    Once per process: neither changes under a running hub."""
    digest = hashlib.sha256(CLIENT.read_bytes())
    built = package / "labextension"
    if (built / "package.json").is_file():
        for tree in (_tree(package, "*.py"), _tree(built, "*")):
            for name, content in sorted(tree.items()):
                digest.update(f"\0{name}\0{len(content)}\0".encode())
                digest.update(content)
    return digest.hexdigest()


def common_files(common: Path) -> list[Path]:
    """The stack's common files: its folder's own files, named as a host's agent takes
    them (a ``__pycache__`` is none), so that a copy of them names the same environment."""
    return sorted(p for p in common.iterdir() if p.is_file() and FILE_NAME.fullmatch(p.name))


def files_sha256(files: list[Path]) -> str:
    """One hash of ``files``' names and contents (their order is the caller's)."""
    digest = hashlib.sha256()
    for path in files:
        data = path.read_bytes()
        digest.update(f"{path.name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def requirement_count(lock_text: str) -> int:
    """How many packages a hashed lock names (one unindented line each)."""
    return sum(
        1
        for line in lock_text.splitlines()
        if line and not line[0].isspace() and not line.startswith(("#", "-"))
    )


def pip_percent(files_seen: int, total: int) -> int:
    """Build progress while pip fetches: venv 0-5%, files 5-80%, install 80-95%."""
    return 5 + min(75, 75 * files_seen // max(total, 1))


def install_lab_extension(prefix: Path, site_packages: Path, package: Path = LAB_PACKAGE) -> bool:
    """composespawner-lab into the environment at ``prefix``, each part replaced whole.

    False, and nothing changed, when the extension is not built: a notebook runs
    without it rather than not at all.
    """
    built = package / "labextension"
    if not (built / "package.json").is_file():
        return False
    _replace_tree(package, site_packages / "composespawner_lab", "*.py")
    _replace_tree(built, prefix / "share" / "jupyter" / "labextensions" / LAB_EXTENSION, "*")
    config = prefix / "etc" / "jupyter" / "jupyter_server_config.d" / "composespawner_lab.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    if not config.is_file() or config.read_bytes() != LAB_SERVER_CONFIG:
        partial = config.with_name(f".{config.name}.partial")
        partial.write_bytes(LAB_SERVER_CONFIG)
        partial.chmod(0o644)
        os.replace(partial, config)
    return True


def _tree(folder: Path, pattern: str) -> dict[str, bytes]:
    return {
        str(f.relative_to(folder)): f.read_bytes() for f in folder.rglob(pattern) if f.is_file()
    }


def _replace_tree(source: Path, target: Path, pattern: str) -> None:
    """``source``'s files matching ``pattern`` as ``target``, swapped in by renames: a
    notebook server starting meanwhile sees the old folder or the new, never half of one."""
    files = _tree(source, pattern)
    if target.is_dir() and _tree(target, pattern) == files:  # a __pycache__ is no change
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial, old = (target.with_name(f".{target.name}.{end}") for end in ("partial", "old"))
    for leftover in (partial, old):
        shutil.rmtree(leftover, ignore_errors=True)
    for name, content in files.items():
        (partial / name).parent.mkdir(parents=True, exist_ok=True)
        (partial / name).write_bytes(content)
    for made in (partial, *partial.rglob("*")):
        made.chmod(0o755 if made.is_dir() else 0o644)
    if target.exists():
        target.rename(old)
    partial.rename(target)
    shutil.rmtree(old, ignore_errors=True)


class StackEnvironments:
    """Builds stack environments under ``root`` and says where they are."""

    def __init__(
        self,
        root: Path,
        common: Path,
        *,
        build_timeout: float = BUILD_TIMEOUT,
        log: logging.Logger | None = None,
    ) -> None:
        self.root = root
        self.common = common
        # Environments run on the hub's own Python version, for which the locks are made.
        self.python = sys.executable
        self.build_timeout = build_timeout
        self.log = log or logging.getLogger(__name__)
        self._python_version = ".".join(map(str, sys.version_info[:3]))
        # One build per environment in this process; a second start waits on it.
        self._builds: dict[Path, asyncio.Future[StackEnvironment]] = {}
        self._listeners: dict[Path, list[Progress]] = {}
        # Per stack: what its files were checked as (the stack, its lock's mtime and size,
        # its common files' names, mtimes and sizes) and its environment.
        self._checked: dict[str, tuple[tuple[object, ...], StackEnvironment]] = {}

    def environment(self, stack: Stack) -> StackEnvironment:
        """Where ``stack``'s environment is (built or not); refuses a lock that changed."""
        build = stack.cpu
        if build is None:
            raise StackBuildError(
                f"The {stack.label} stack has no CPU lock, so it cannot run here."
                " An administrator adds one to the catalog (`make locks` writes it)."
            )
        try:
            seen = build.lock.stat()
            files = common_files(self.common)  # what the build runs and copies
            # Hashed again only when a file changed: every start asks, a storm too.
            checked = (stack, seen.st_mtime_ns, seen.st_size, tuple(map(_seen, files)))
            known = self._checked.get(stack.id)
            if known is not None and known[0] == checked:
                return known[1]
            actual = lock_hash(build.lock)
            common_sha256 = files_sha256(files)
        except OSError as e:
            raise StackBuildError(
                f"The {stack.label} stack's files cannot be read ({e.strerror}:"
                f" {e.filename or build.lock})."
            ) from e
        if actual != build.lock_sha256:
            raise StackBuildError(
                f"The {stack.label} stack's lock {build.lock} has changed since the catalog"
                f" pinned it (sha256 {actual[:12]}…, catalog {build.lock_sha256[:12]}…)."
                " An administrator puts the new hash in the catalog or restores the lock."
            )
        key = environment_key(
            build.lock_sha256, self._python_version, common_sha256, notebook_side_sha256()
        )
        environment = StackEnvironment(stack, self.root / f"{stack.id}-{key}")
        self._checked[stack.id] = (checked, environment)
        return environment

    def ready(self, stack: Stack) -> StackEnvironment | None:
        environment = self.environment(stack)
        return environment if self.built(environment) else None

    def built(self, environment: StackEnvironment) -> bool:
        """Whether ``environment`` is whole, and so may be run (its manifest goes in last)."""
        return environment.manifest.is_file()

    async def ensure(self, stack: Stack, progress: Progress) -> StackEnvironment:
        """The stack's environment, built first if it is not there yet."""
        environment = self.environment(stack)
        if self.built(environment):
            return environment
        listeners = self._listeners.setdefault(environment.path, [])
        listeners.append(progress)
        try:
            build = self._builds.get(environment.path)
            if build is None:
                build = asyncio.ensure_future(self._build(stack, environment))
                self._builds[environment.path] = build
                build.add_done_callback(lambda _: self._builds.pop(environment.path, None))
            return await asyncio.shield(build)
        finally:
            listeners.remove(progress)

    def _tell(self, environment: StackEnvironment, percent: int, message: str) -> None:
        for listener in list(self._listeners.get(environment.path, ())):
            listener(message, percent)

    async def _build(self, stack: Stack, environment: StackEnvironment) -> StackEnvironment:
        assert stack.cpu is not None
        self.root.mkdir(parents=True, exist_ok=True)
        held = os.open(self.root / f".{environment.path.name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            # Another hub process may be building it: wait for it, then use its work.
            await asyncio.to_thread(fcntl.flock, held, fcntl.LOCK_EX)
            if environment.manifest.is_file():
                return environment
            started = asyncio.get_running_loop().time()
            try:
                await asyncio.wait_for(
                    self._make(stack, environment, stack.cpu.lock), self.build_timeout
                )
            except BaseException as e:
                # Half an environment is no environment: the next start begins anew.
                await asyncio.to_thread(shutil.rmtree, environment.path, True)
                if isinstance(e, TimeoutError):
                    raise StackBuildError(
                        f"Building the {stack.label} stack took longer than"
                        f" {self.build_timeout:.0f} s. Try again; if it keeps failing,"
                        " an administrator checks the package index."
                    ) from e
                raise
        finally:
            os.close(held)  # and with it the lock
        seconds = asyncio.get_running_loop().time() - started
        self.log.info("Built the %s stack in %s (%.0f s)", stack.id, environment.path, seconds)
        return environment

    async def _make(self, stack: Stack, environment: StackEnvironment, lock: Path) -> None:
        path = environment.path
        await asyncio.to_thread(shutil.rmtree, path, True)  # an earlier build's remains
        say = f"building the {stack.label} stack (first use; cached after)"
        self._tell(environment, 1, f"{say}: 1%")
        await self._run([self.python, "-m", "venv", str(path)], environment, "create")
        python = str(path / "bin" / "python")
        total = requirement_count(await asyncio.to_thread(lock.read_text, encoding="utf-8"))
        seen = 0
        last = 0

        def on_line(line: str) -> None:
            nonlocal seen, last
            if line.startswith(_PIP_FILE_LINES):
                seen += 1
                percent = pip_percent(seen, total)
            elif line.startswith("Installing collected packages"):
                percent = 80
            else:
                return
            if percent >= last + 5:
                last = percent
                self._tell(environment, percent, f"{say}: {percent}%")

        pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
        await self._run(
            [
                *pip,
                *("--progress-bar", "off", "--no-deps", "--require-hashes"),
                *("--only-binary", ":all:", "-r", str(lock)),
            ],
            environment,
            "install",
            on_line,
        )
        self._tell(environment, 95, f"{say}: 95%")
        await asyncio.to_thread(self._add_notebook_side, environment)
        # The manifest goes in last, under its own name only once whole.
        partial = path / f".{MANIFEST}.partial"
        await self._run(
            [
                *(python, str(self.common / "stack_manifest.py")),
                *("--stack", stack.id, "--variant", "cpu", "--lock", str(lock)),
                *("--out", str(partial)),
            ],
            environment,
            "describe",
        )
        os.replace(partial, environment.manifest)
        self._tell(environment, 100, f"{say}: 100%")

    def _add_notebook_side(self, environment: StackEnvironment) -> None:
        """The repro helper and composespawner's client, as the images get them: this
        package's versions (:func:`notebook_side_sha256`), put in as it is built."""
        version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        site_packages = environment.path / "lib" / version / "site-packages"
        (site_packages / "composespawner").mkdir(exist_ok=True)
        for source, target in (
            (self.common / "repro.py", site_packages / "repro.py"),
            (CLIENT, site_packages / "composespawner" / "client.py"),
            (None, site_packages / "composespawner" / "__init__.py"),
        ):
            content = b"" if source is None else source.read_bytes()
            if not target.is_file() or target.read_bytes() != content:
                partial = target.with_name(f".{target.name}.partial")
                partial.write_bytes(content)
                partial.chmod(0o644)
                os.replace(partial, target)
        if not install_lab_extension(environment.path, site_packages):
            self.log.warning(
                "The JupyterLab extension is not built (make labextension):"
                " notebooks on %s run without it",
                environment.path,
            )

    async def _run(
        self,
        command: list[str],
        environment: StackEnvironment,
        step: str,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        tail: list[str] = []
        try:
            assert process.stdout is not None
            async for raw in process.stdout:
                line = raw.decode(errors="replace").rstrip()
                tail = [*tail[-19:], line]
                if on_line is not None:
                    on_line(line)
            status = await process.wait()
        except BaseException:
            if process.returncode is None:
                process.kill()
                await process.wait()
            raise
        if status != 0:
            self.log.error(
                "Building %s failed at %s (exit %s): %s\n%s",
                environment.path,
                step,
                status,
                " ".join(command),
                "\n".join(tail),
            )
            raise StackBuildError(
                f"The {environment.stack.label} stack could not be built ({step} step failed)."
                " Try again; if it keeps failing, an administrator finds the cause in the"
                " hub's log."
            )


def _seen(path: Path) -> tuple[str, int, int]:
    found = path.stat()
    return path.name, found.st_mtime_ns, found.st_size
