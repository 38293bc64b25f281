"""The stacks' notebook images, built here without the network: ``make images``.

No base image can be pulled on this network, so the base is made here: a Debian root
(bookworm, ``--variant=minbase`` with Python 3.11 and its venv) by debootstrap from
the Debian mirror apt uses, turned into an image ``FROM scratch``. Each stack's
``images/<stack>/Dockerfile`` is then built on it with rootful podman, the network
off, the lock's wheels (fetched beforehand by pip, which reaches the package index)
mounted at ``/wheels``. A site with registry access gives the Dockerfile's default
base instead (``python:3.11-slim-bookworm`` by digest) and builds it as it is.

Everything is kept by what it is made from (the input hash of each image is in its
tag and its ``io.composespawner.inputs`` label): a second ``make images`` builds
nothing, and a changed lock, Dockerfile, common file, client or lab extension builds
that stack's image anew. Podman's storage and the wheels live under
``~/.cache/composespawner`` (root's, with podman's own config: runc, cgroupfs).

Each built image is pushed to the registry (Debian's ``docker-registry`` on
127.0.0.1:5000, its data in the cache too) and known by its digest from then on; what
was built is written to ``images.json`` in the cache: per stack and variant, the
image's tag, digest, input hash and the hash of its installed tree
(:func:`tree_sha256`, over ``/opt/stack``: every path, mode, link and content).

    python -m harness.images [--variant cpu] [--stack pytorch ...]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from harness.paths import ROOT

CACHE = Path.home() / ".cache" / "composespawner"
CONTAINERS = CACHE / "containers"
WHEELS = CACHE / "wheels"
STACKS = ("pytorch", "tensorflow")
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "tzdata")
REGISTRY = "127.0.0.1:5000"
BUILT = CACHE / "images.json"
# crun refuses this machine's hybrid cgroups; the default ulimits cannot be raised here.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
# How the images are built, beyond their files: part of each image's inputs. Change it
# with what build_stack passes podman, so that every image is built anew that way.
RECIPE = "3 network=none timestamp=SOURCE_DATE_EPOCH wheels=/wheels no-cache"
BUILD_TIMEOUT = 1800.0  # seconds for one image: pip installs a gigabyte of wheels
STEP_TIMEOUT = 600.0  # seconds for any other step (debootstrap, a push)


@dataclass(frozen=True, slots=True)
class BuiltImage:
    """One stack image as built and pushed here."""

    stack: str
    variant: str
    tag: str  # localhost/composespawner/<stack>-<variant>:<inputs[:16]>
    digest: str  # sha256:… of the manifest pushed to the registry
    inputs: str  # the input hash
    tree_sha256: str  # the installed tree's hash (see tree_sha256)

    @property
    def by_digest(self) -> str:
        """The image as notebooks run it: pulled by its digest from the registry."""
        return f"{REGISTRY}/composespawner/{self.stack}-{self.variant}@{self.digest}"


# -- podman, with this project's config --------------------------------------------


def podman_env() -> dict[str, str]:
    """The environment podman runs in: this project's config and storage in the cache."""
    CONTAINERS.mkdir(parents=True, exist_ok=True)
    conf, storage = CONTAINERS / "containers.conf", CONTAINERS / "storage.conf"
    storage_text = (
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{CONTAINERS / "storage"}"\n'
        'runroot = "/run/composespawner-containers"\n'
    )
    registries = CONTAINERS / "registries.conf"
    # The tests' registry speaks plain HTTP on loopback, as a site's never should.
    registries_text = f'[[registry]]\nlocation = "{REGISTRY}"\ninsecure = true\n'
    for path, text in (
        (conf, CONTAINERS_CONF),
        (storage, storage_text),
        (registries, registries_text),
    ):
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
    return {
        **os.environ,
        "CONTAINERS_CONF": str(conf),
        "CONTAINERS_STORAGE_CONF": str(storage),
        "CONTAINERS_REGISTRIES_CONF": str(registries),
    }


def podman(*args: str, timeout: float = STEP_TIMEOUT, quiet: bool = True) -> str:
    """Run ``podman args``; its output. CalledProcessError names what failed."""
    done = subprocess.run(
        ["podman", *args],
        env=podman_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if quiet else None,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])} failed: {(done.stderr or '')[-2000:]}")
    return done.stdout


def image_id(tag: str) -> str:
    return podman("image", "inspect", "--format", "{{.Id}}", tag).strip()


def notebook_containers() -> list[str]:
    """The names of the notebook containers podman has, running or not."""
    listed = podman(
        *("ps", "--all", "--format", "{{.Names}}"),
        *("--filter", "label=io.composespawner.notebook"),
        timeout=60,
    )
    return listed.split()


def image_exists(tag: str) -> bool:
    return (
        subprocess.run(
            ["podman", "image", "exists", tag], env=podman_env(), timeout=60, check=False
        ).returncode
        == 0
    )


# -- what each image is made of ------------------------------------------------------


def files_sha256(paths: Sequence[Path], base: Path = ROOT) -> str:
    """One hash of files (and folders' files, sorted), by their paths below ``base``."""
    digest = hashlib.sha256()
    for top in paths:
        files = sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top]
        for path in files:
            if "__pycache__" in path.parts:
                continue
            data = path.read_bytes()
            digest.update(f"{path.relative_to(base)}\0{len(data)}\0".encode())
            digest.update(data)
    return digest.hexdigest()


def base_inputs() -> str:
    return hashlib.sha256(f"{SUITE} {' '.join(BASE_PACKAGES)} {mirror()}".encode()).hexdigest()


def stack_inputs(stack: str, variant: str, base: str) -> str:
    """Everything ``stack``'s image is made from: the base, its Dockerfile and lock, the
    common files, the client and the built lab extension."""
    files = [
        ROOT / "images" / stack / "Dockerfile",
        ROOT / "images" / stack / f"requirements-{variant}.lock",
        ROOT / "images" / "common",
        ROOT / "composespawner" / "client.py",
        ROOT / "labextension" / "composespawner_lab",
    ]
    made_from = f"{RECIPE} {base} {variant} {files_sha256(files)}"
    return hashlib.sha256(made_from.encode()).hexdigest()


def mirror() -> str:
    """The Debian mirror apt uses here (deb822 or one-line sources)."""
    for sources in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    return "http://deb.debian.org/debian"


# -- building ----------------------------------------------------------------------------


def build_base() -> str:
    """The Debian base image's tag, made first if it is not there."""
    tag = f"localhost/composespawner/base:{base_inputs()[:16]}"
    if image_exists(tag):
        return tag
    with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
        root = Path(scratch) / "root"
        say(f"debootstrap {SUITE} into {root} (a minute or two, once)")
        subprocess.run(
            [
                *("debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}"),
                *(SUITE, str(root), mirror()),
            ],
            check=True,
            timeout=STEP_TIMEOUT,
            stdout=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
            for path in (root / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        subprocess.run(
            ["tar", "-C", str(root), "--numeric-owner", "-cf", f"{scratch}/rootfs.tar", "."],
            check=True,
            timeout=STEP_TIMEOUT,
        )
        (Path(scratch) / "Containerfile").write_text(
            'FROM scratch\nADD rootfs.tar /\nCMD ["/bin/bash"]\n'
        )
        podman("build", "--network", "none", "-t", tag, scratch)
    return tag


def fetch_wheels(stack: str, variant: str) -> Path:
    """The lock's wheels, fetched once by pip (it reaches the index; the build does not)."""
    lock = ROOT / "images" / stack / f"requirements-{variant}.lock"
    folder = WHEELS / hashlib.sha256(lock.read_bytes()).hexdigest()[:32]
    if (folder / ".complete").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    say(f"fetching the wheels of {lock.relative_to(ROOT)}")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
            *("--require-hashes", "--only-binary=:all:", "-r", str(lock), "-d", str(folder)),
        ],
        check=False,
        timeout=BUILD_TIMEOUT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:  # pip's own words; its warnings otherwise (index folders) are noise
        raise RuntimeError(f"pip download of {lock} failed: {done.stderr[-2000:]}")
    (folder / ".complete").write_text("")
    return folder


def source_date_epoch(stack: str, variant: str) -> str:
    """When the lock last changed, as git says (the same in every clone); 0 outside git."""
    lock = f"images/{stack}/requirements-{variant}.lock"
    done = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%ct", "--", lock],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "0"


def build_stack(stack: str, variant: str, base: str) -> tuple[str, str]:
    """``stack``'s image (its tag and input hash), built if it is not there."""
    inputs = stack_inputs(stack, variant, base)
    tag = f"localhost/composespawner/{stack}-{variant}:{inputs[:16]}"
    if image_exists(tag):
        return tag, inputs
    wheels = fetch_wheels(stack, variant)
    say(f"building {tag} (pip installs the lock: minutes, once)")
    started = time.monotonic()
    reproducible_build(
        tag,
        ROOT / "images" / stack / "Dockerfile",
        ROOT,
        wheels,
        {"BASE": base, "VARIANT": variant},
        source_date_epoch(stack, variant),
        ("--label", f"io.composespawner.inputs={inputs}"),
        cache=False,  # a layer cached from another recipe's build would carry its times
    )
    say(f"built {tag} in {time.monotonic() - started:.0f} s")
    return tag, inputs


def reproducible_build(
    tag: str,
    dockerfile: Path,
    context: Path,
    wheels: Path,
    args: dict[str, str],
    epoch: str,
    more: Sequence[str] = (),
    cache: bool = True,
) -> None:
    """Build ``dockerfile`` as :data:`RECIPE` says: no network, the wheels at /wheels and
    pip told to find them there alone, byte code by hash and every timestamp (the image's
    and its files') ``epoch``: the same inputs give the same image, to its ID."""
    build_args = {**args, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wheels"}
    build_args["SOURCE_DATE_EPOCH"] = epoch
    podman(
        *("build", "--network", "none", "--pull=never", "--timestamp", epoch, "-t", tag),
        *(() if cache else ("--no-cache",)),
        *("-f", str(dockerfile), "-v", f"{wheels}:/wheels:ro"),
        *(arg for name, value in build_args.items() for arg in ("--build-arg", f"{name}={value}")),
        *more,
        str(context),
        timeout=BUILD_TIMEOUT,
    )


def tree_sha256(tag: str, top: str = "opt/stack") -> str:
    """The hash of the image's installed tree below ``top``: every entry's path, mode and
    owner, each link's target and each file's content, in path order (mtimes left out:
    they say when a build ran, not what it installed)."""
    mount = Path(podman("image", "mount", tag).strip())
    try:
        digest = hashlib.sha256()
        for path in sorted((mount / top).rglob("*")):
            found = path.lstat()
            entry = f"{path.relative_to(mount)}\0{found.st_mode:o}\0{found.st_uid}:{found.st_gid}\0"
            digest.update(entry.encode())
            if stat.S_ISLNK(found.st_mode):
                digest.update(os.readlink(path).encode())
            elif stat.S_ISREG(found.st_mode):
                digest.update(path.read_bytes())
        return digest.hexdigest()
    finally:
        podman("image", "unmount", tag)


# -- the registry ------------------------------------------------------------------------


@contextlib.contextmanager
def registry() -> Iterator[str]:
    """Debian's docker-registry on 127.0.0.1:5000, its data in the cache; its address.

    One already answering there (a test's) is used as it is."""
    if _answers(REGISTRY):
        yield REGISTRY
        return
    data = CACHE / "registry"
    data.mkdir(parents=True, exist_ok=True)
    config = data / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {data / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: {REGISTRY}}}\n"
    )
    process = subprocess.Popen(
        ["docker-registry", "serve", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        _wait_listening(process, lambda: _answers(REGISTRY), f"docker-registry on {REGISTRY}")
        yield REGISTRY
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextlib.contextmanager
def podman_socket() -> Iterator[str]:
    """Podman's Docker-compatible API on a Unix socket of its own (``podman system
    service``), with this project's config; its ``unix://`` URL, for Docker's clients."""
    path = Path("/run/composespawner-podman.sock")
    path.unlink(missing_ok=True)
    process = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{path}"],
        env=podman_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        _wait_listening(process, lambda: _socket_answers(path), f"podman's service on {path}")
        yield f"unix://{path}"
    finally:
        process.terminate()
        process.wait(timeout=30)
        path.unlink(missing_ok=True)


def _wait_listening(
    process: subprocess.Popen[bytes], listening: Callable[[], bool], what: str
) -> None:
    deadline = time.monotonic() + 30
    while not listening():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen")
        time.sleep(0.05)  # polling the address: the condition itself


def _socket_answers(path: Path) -> bool:
    with (
        contextlib.suppress(OSError),
        socket.socket(socket.AF_UNIX) as probe,
    ):
        probe.settimeout(1)
        probe.connect(str(path))
        return True
    return False


def _answers(address: str) -> bool:
    host, port = address.split(":")
    with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=1):
        return True
    return False


def push(tag: str, stack: str, variant: str) -> str:
    """Push ``tag`` to the registry; the digest it is known by there."""
    with tempfile.NamedTemporaryFile(dir=CACHE, prefix="digest-") as digestfile:
        podman(
            *("push", "--tls-verify=false", "--digestfile", digestfile.name),
            *(tag, f"docker://{REGISTRY}/composespawner/{stack}-{variant}:latest"),
        )
        return Path(digestfile.name).read_text().strip()


# -- the whole ---------------------------------------------------------------------------


def built() -> dict[str, BuiltImage]:
    """What ``make images`` built last, by ``<stack>-<variant>``."""
    try:
        found = json.loads(BUILT.read_text())
    except (OSError, ValueError):
        return {}
    known = {field.name for field in fields(BuiltImage)}
    return {
        name: BuiltImage(**{k: v for k, v in image.items() if k in known})
        for name, image in found.items()
    }


def build(stacks: Sequence[str] = STACKS, variant: str = "cpu") -> dict[str, BuiltImage]:
    """Every stack's image, built where its inputs changed, pushed, recorded."""
    if shutil.which("podman") is None or shutil.which("debootstrap") is None:
        raise SystemExit("make images needs podman, buildah's tools and debootstrap (make images)")
    base = build_base()
    images = built()
    made = {stack: build_stack(stack, variant, base) for stack in stacks}
    new = {
        stack: (tag, inputs)
        for stack, (tag, inputs) in made.items()
        if (known := images.get(f"{stack}-{variant}")) is None or known.tag != tag
    }
    if new:
        with registry():
            for stack, (tag, inputs) in new.items():
                digest = push(tag, stack, variant)
                image = BuiltImage(stack, variant, tag, digest, inputs, tree_sha256(tag))
                images[f"{stack}-{variant}"] = image
                say(f"{stack}-{variant}: {image.by_digest} (tree {image.tree_sha256[:16]}…)")
    result = {f"{stack}-{variant}": images[f"{stack}-{variant}"] for stack in stacks}
    # Pulled by digest once here, as a host's first notebook on it would: kept, so that
    # the demo's notebooks start without the registry running.
    unpulled = [image for image in result.values() if not image_exists(image.by_digest)]
    if unpulled:
        with registry():
            for image in unpulled:
                podman("pull", "--quiet", image.by_digest)
    # With each image's name by digest: what a hub's launcher is told to run (a running
    # demo hub reads it at each start, so it is written once the images are here).
    record = {n: {**asdict(i), "image": i.by_digest} for n, i in images.items()}
    partial = BUILT.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(BUILT)
    return result


def build_again(stack: str, variant: str = "cpu") -> dict[str, object]:
    """Build ``stack``'s image a second time from the same inputs, no layer reused, and
    say whether it is the same: its ID (config and layers), and its installed tree."""
    first = built()[f"{stack}-{variant}"]
    again = f"{first.tag}-again"
    started = time.monotonic()
    reproducible_build(
        again,
        ROOT / "images" / stack / "Dockerfile",
        ROOT,
        fetch_wheels(stack, variant),
        {"BASE": f"localhost/composespawner/base:{base_inputs()[:16]}", "VARIANT": variant},
        source_date_epoch(stack, variant),
        ("--label", f"io.composespawner.inputs={first.inputs}"),
        cache=False,
    )
    seconds = time.monotonic() - started
    try:
        ids = [
            podman("image", "inspect", "--format", "{{.Id}}", t).strip() for t in (first.tag, again)
        ]
        trees = [first.tree_sha256, tree_sha256(again)]
    finally:
        podman("rmi", again)
    return {
        "stack": f"{stack}-{variant}",
        "image_id": ids,
        "tree_sha256": trees,
        "same_image": ids[0] == ids[1],
        "same_tree": trees[0] == trees[1],
        "build_seconds": round(seconds, 1),
    }


def say(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the stacks' notebook images here.")
    parser.add_argument("--stack", action="append", choices=STACKS, help="default: every stack")
    parser.add_argument("--variant", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument(
        "--again", action="store_true", help="build each a second time and compare (no cache)"
    )
    args = parser.parse_args(argv)
    if args.again:
        for stack in args.stack or STACKS:
            print(json.dumps(build_again(stack, args.variant)))
        return 0
    for name, image in build(args.stack or STACKS, args.variant).items():
        print(f"{name}\t{image.by_digest}\t{image.tree_sha256}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
