#!/usr/bin/env python3
"""Checks .github/workflows/release.yml without running it (no workflow runs on the CI
machines): it parses as YAML; a version tag triggers it; the version job compares the tag with
the crates' and the npm package's version; the npm job builds with the repository's scripts
(every script it names exists), publishes with --provenance and has the id-token permission
provenance needs; the server job builds the binary with the Rust image the Dockerfile's
builder stage uses, packages it with the Dockerfile's prebuilt stage, pushes the image with
provenance and attests the binary; and every action is pinned to a major version.

usage: check_release.py WORKFLOW_FILE
"""
import os
import re
import sys

import yaml


def fail(msg):
    print(f"check_release: {msg}", file=sys.stderr)
    sys.exit(1)


def runs(job):
    return "\n".join(step.get("run", "") for step in job.get("steps", []))


def uses(job):
    return [step["uses"] for step in job.get("steps", []) if "uses" in step]


def main():
    path = sys.argv[1]
    root = os.path.abspath(os.path.join(os.path.dirname(path), "..", ".."))
    with open(path) as f:
        doc = yaml.safe_load(f)
    trigger = doc.get("on", doc.get(True)) or fail("no trigger")
    if trigger.get("push", {}).get("tags") != ["v*"]:
        fail(f"not triggered by a version tag: {trigger}")
    jobs = doc.get("jobs") or fail("no jobs")
    for name in ("version", "npm", "server"):
        if name not in jobs:
            fail(f"no job {name}")
    version = runs(jobs["version"])
    for needle in ("Cargo.toml", "npm/package.json", "GITHUB_REF_NAME"):
        if needle not in version:
            fail(f"the version job does not compare the tag with {needle}")
    npm = jobs["npm"]
    if npm.get("permissions", {}).get("id-token") != "write":
        fail("the npm job lacks id-token: write (npm provenance needs it)")
    script = runs(npm)
    for s in re.findall(r"scripts/[\w.-]+", script):
        if not os.path.exists(os.path.join(root, s)):
            fail(f"the npm job runs {s}, which does not exist")
    for needle in ("scripts/setup-toolchain.sh", "scripts/build-npm.sh", "npm publish", "--provenance"):
        if needle not in script:
            fail(f"the npm job does not run {needle}")
    server = jobs["server"]
    script = runs(server)
    dockerfile = open(os.path.join(root, "server-native/Dockerfile")).read()
    builder = re.search(r"^ARG BUILDER_IMAGE=(\S+)", dockerfile, re.M) or fail("no BUILDER_IMAGE in the Dockerfile")
    if builder.group(1) not in script:
        fail(f"the server is not built with {builder.group(1)}, the Dockerfile's builder image")
    if npm.get("container") != builder.group(1):
        fail(f"the npm job does not build in {builder.group(1)}")
    if "FROM scratch AS binary-prebuilt" not in dockerfile:
        fail("the Dockerfile has no prebuilt stage")
    push = [s for s in server["steps"] if s.get("uses", "").startswith("docker/build-push-action@")]
    if len(push) != 1:
        fail("the server job does not push one image")
    w = push[0]["with"]
    if w.get("file") != "server-native/Dockerfile" or w.get("build-args") != "BINARY=prebuilt" \
            or not str(w.get("provenance", "")).startswith("mode=") or w.get("push") is not True:
        fail(f"the image is not server-native/Dockerfile's prebuilt stage, pushed with provenance: {w}")
    if not any(u.startswith("actions/attest-build-provenance@") for u in uses(server)):
        fail("the server binary has no provenance attestation")
    for job in jobs.values():
        for u in uses(job):
            if not re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", u):
                fail(f"action {u} is not pinned to a major version")
    print(f"release workflow {path}: ok ({len(jobs)} jobs)")


main()
