#!/usr/bin/env python3
"""Checks server-native/compose.yaml without a compose engine (none runs on the CI machine):
it parses as YAML; PostgreSQL runs with wal_level=logical; the synchro services build
server-native/Dockerfile and run `install`, `serve`, `capture` and `compact --every` (nothing
else compacts retention); every environment
variable a synchro service sets is one its subcommand reads (from `synchro-server <command>
--help`, so a renamed variable fails here); every mounted file exists; and, when
docker compose or a podman-compose with `config` is installed, `config` accepts the file.

usage: check_compose.py COMPOSE_FILE SYNCHRO_SERVER_BINARY
"""
import os
import re
import shutil
import subprocess
import sys

import yaml


def fail(msg):
    print(f"check_compose: {msg}", file=sys.stderr)
    sys.exit(1)


def env_names(binary, command):
    out = subprocess.run([binary, command, "--help"], capture_output=True, text=True, check=True)
    return set(re.findall(r"\[env: ([A-Z0-9_]+)[=\]]", out.stdout))


def main():
    path, binary = sys.argv[1], sys.argv[2]
    with open(path) as f:
        doc = yaml.safe_load(f)
    services = doc.get("services") or fail("no services")
    for name in ("postgres", "install", "server", "capture", "compaction"):
        if name not in services:
            fail(f"no service {name}")
    if "wal_level=logical" not in services["postgres"].get("command", []):
        fail("postgres does not run with wal_level=logical")
    expected = {"install": ["install"], "server": ["serve"], "capture": ["capture"],
                "compaction": ["compact", "--every", "60"]}
    for name, args in expected.items():
        s = services[name]
        command = args[0]
        build = s.get("build") or {}
        if build.get("dockerfile") != "server-native/Dockerfile":
            fail(f"{name} does not build server-native/Dockerfile")
        if s.get("command") != args:
            fail(f"{name} runs {s.get('command')}, not {args!r}")
        accepted = env_names(binary, command)
        for var in s.get("environment", {}):
            if var not in accepted:
                fail(f"{name}: synchro-server {command} reads no {var} (it reads {sorted(accepted)})")
    base = os.path.dirname(os.path.abspath(path))
    for name, s in services.items():
        for v in s.get("volumes", []):
            src = v.split(":")[0]
            if src.startswith(".") and not os.path.exists(os.path.join(base, src)):
                fail(f"{name} mounts {src}, which does not exist")
    engine = None
    # podman-compose 1.0 (Debian 12) has no `config`, and its --dry-run still creates volumes.
    if shutil.which("podman-compose") and "config" in subprocess.run(
            ["podman-compose", "--help"], capture_output=True, text=True).stdout:
        engine = ["podman-compose"]
    elif shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                   capture_output=True).returncode == 0:
        engine = ["docker", "compose"]
    if engine:
        env = dict(os.environ, POSTGRES_PASSWORD="x", SYNCHRO_ADAPTER_PASSWORD="x",
                   SYNCHRO_WORKER_PASSWORD="x", SYNCHRO_OPERATOR_PASSWORD="x",
                   SYNCHRO_JWT_SECRET="x")
        r = subprocess.run(engine + ["-f", path, "config"], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"{' '.join(engine)} config: {r.stderr.strip()}")
    print(f"compose file {path}: ok ({len(services)} services; "
          f"{' '.join(engine) + ' config ok' if engine else 'no compose engine here, YAML checks only'})")


main()
