"""Writes seed corpora for the fuzz targets from the conformance vectors (idempotent)."""
import hashlib, json, os, sys

vectors, out = sys.argv[1], sys.argv[2]
TYPES = ["string", "int", "int64", "decimal", "float", "boolean", "datetime", "date", "time", "json", "bytes"]
seeds = {t: [] for t in ["json", "typed_value", "decimal", "manifest", "row_identity", "semver", "checksum", "conformance", "token"]}

conf = json.load(open(os.path.join(vectors, "conformance-v1.json")))["cases"]
conf += json.load(open(os.path.join(vectors, "synchro-v1.json")))["cases"]
upstream = json.load(open(os.path.join(vectors, "upstream", "canonical-v1.json")))["vectors"]
for c in conf + [{"command": v["kind"], "input": v["input"]} for v in upstream]:
    i = c["input"]
    if "field_spec" in i:
        sel = TYPES.index(i["field_spec"]["type"]) * 2 + (1 if i["field_spec"]["nullable"] else 0)
        seeds["typed_value"].append(bytes([sel]) + i["raw_json"].encode())
    if "manifest_json" in i:
        seeds["manifest"].append(i["manifest_json"].encode())
    for k in ("text", "row_json", "pk_json"):
        if k in i:
            seeds["json"].append(i[k].encode())
    if "source" in i:
        seeds["decimal"].append(i["source"].encode())
    for k in ("a", "b"):
        if k in i:
            seeds["semver"].append(i[k].encode())
    for e in i.get("entries", []):
        seeds["row_identity"].append(bytes.fromhex(e["row_identity_hex"]))
    cmd = {"typed_value": "typed-value", "schema_manifest": "manifest", "row_identity": "row-identity",
           "row_digest": "row-digest", "scope_digest": "scope-digest"}.get(c["command"], c["command"])
    seeds["conformance"].append(json.dumps({"cases": [{"id": "s", "command": cmd, "input": i}]}).encode())
d = "0123456789abcdef" * 4
seeds["token"].append(b"c1.eyJrZXlfaWQiOiJrIn0.AAAA")
seeds["checksum"].append(json.dumps({"algorithm": "sha256", "version": 1, "encoding": "hex", "digest": d}).encode())

for target, items in seeds.items():
    path = os.path.join(out, target)
    os.makedirs(path, exist_ok=True)
    for s in items:
        with open(os.path.join(path, "seed-" + hashlib.sha1(s).hexdigest()), "wb") as f:
            f.write(s)
print("[fuzz] seeds:", ", ".join(f"{t}={len(v)}" for t, v in seeds.items()))
