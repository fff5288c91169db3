"""Writes vectors/seed-v1.json: portable seed bindings (spec 001 "Seed page token", "Seed
continuation receipt", export manifest hash) computed here with Python's json, hashlib, hmac
and base64, independently of the Rust code under test (protocol/src/seed.rs) and of the
SQL that issues the tokens.

json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False) is exactly RFC 8785
for these objects: every member name is ASCII, every value a string, the integer 1, an
object or an array (no floats), and Python escapes a control character as \\u00xx in
lowercase hex and \\b \\f \\n \\r \\t by their short forms, as RFC 8785 does.
The members and the boundary's shape are docs/protocol-decisions.md "Portable seeds".
Run: python3 vectors/tools/make_seed_v1.py  (rewrites the file; review the diff).
"""
import base64, hashlib, hmac, json, os

OUT = os.path.join(os.path.dirname(__file__), "..", "seed-v1.json")
MANIFEST_DOMAIN = b"synchro:v3:seed-export-manifest:v1\x00"
PAGE_DOMAIN = b"synchro:v3:seed-page:v1\x00"
RECEIPT_DOMAIN = b"synchro:v3:seed-continuation:v1\x00"


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def b64(raw):
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def token(prefix, domain, key, payload):
    text = canonical(payload).encode()
    mac = hmac.new(key, domain + text, hashlib.sha256).digest()
    return f"{prefix}.{b64(text)}.{b64(mac)}"


def checksum(hex_digest):
    return {"algorithm": "sha256", "version": 1, "encoding": "hex", "digest": hex_digest}


PAGE_KEY = bytes(range(32))
RECEIPT_KEY = bytes(range(100, 140))
SCHEMA_HASH = hashlib.sha256(b"a schema").hexdigest()
EXPORT_ID = "0b3c5e2a-7f41-4c8e-9d2a-5b6c7d8e9f01"
NONCE = b64(hashlib.sha256(b"a transaction nonce").digest())
BOUNDARY = {"kind": "transaction_end", "commit_lsn": "0/16B3748", "position": "4242"}
START = {"kind": "generation_start", "position": "0"}
SCOPES = [
    {"scope_id": "board:demo", "registry_generation": "3", "membership_generation": "7",
     "retention_generation": "1", "cardinality": "100000",
     "checksum": checksum(hashlib.sha256(b"board:demo rows").hexdigest())},
    # Non-ASCII and a control character: the escaping RFC 8785 prescribes.
    {"scope_id": "board:caf\u00e9\u0007\u2028", "registry_generation": "3",
     "membership_generation": "18446744073709551615", "retention_generation": "0",
     "cardinality": "0", "checksum": checksum(hashlib.sha256(b"").hexdigest())},
]


def manifest(key_id, boundary, scopes):
    # The scopes in byte order of their UTF-8 IDs, each once.
    scopes = sorted(scopes, key=lambda s: s["scope_id"].encode())
    return {"kind": "portable_seed_export", "version": 1, "key_id": key_id,
            "export_id": EXPORT_ID, "schema_version": "12", "schema_hash": SCHEMA_HASH,
            "stream_generation": "2", "snapshot_boundary": boundary, "page_limit": "1000",
            "scopes": scopes}


def manifest_hash(body):
    return hashlib.sha256(MANIFEST_DOMAIN + canonical(body).encode()).hexdigest()


cases = []
for name, body in [
    ("two scopes at a transaction end", manifest("seed-page-1", BOUNDARY, SCOPES)),
    ("one scope at a generation start", manifest("k", START, SCOPES[:1])),
    ("no scopes", manifest("k", START, [])),
]:
    cases.append({"kind": "export_manifest_hash", "name": name, "body": body,
                  "expect": manifest_hash(body)})

body = manifest("seed-page-1", BOUNDARY, SCOPES)
mhash = manifest_hash(body)
for scope, ordinal in [(SCOPES[0], "0"), (SCOPES[0], "99000"), (SCOPES[1], "0")]:
    payload = {"kind": "portable_seed_page", "version": 1, "key_id": "seed-page-1",
               "export_id": EXPORT_ID, "transaction_nonce": NONCE,
               "export_manifest_hash": mhash, "schema_hash": SCHEMA_HASH,
               "scope_id": scope["scope_id"],
               "registry_generation": scope["registry_generation"],
               "membership_generation": scope["membership_generation"],
               "retention_generation": scope["retention_generation"],
               "stream_generation": "2", "snapshot_boundary": BOUNDARY,
               "next_row_ordinal": ordinal, "page_limit": "1000"}
    cases.append({"kind": "seed_page_token", "name": f"{scope['scope_id']!r} from {ordinal}",
                  "key_id": "seed-page-1", "key": PAGE_KEY.hex(), "payload": payload,
                  "expect": token("sp1", PAGE_DOMAIN, PAGE_KEY, payload)})
for scope in SCOPES:
    payload = {"kind": "portable_seed_continuation", "version": 1, "key_id": "seed-receipt-1",
               "export_id": EXPORT_ID, "export_manifest_hash": mhash,
               "schema_hash": SCHEMA_HASH, "scope_id": scope["scope_id"],
               "registry_generation": scope["registry_generation"],
               "membership_generation": scope["membership_generation"],
               "retention_generation": scope["retention_generation"],
               "stream_generation": "2", "snapshot_boundary": BOUNDARY,
               "cardinality": scope["cardinality"], "checksum": scope["checksum"],
               "issued_at": "2026-12-06T07:00:00.000000Z"}
    cases.append({"kind": "seed_receipt", "name": repr(scope["scope_id"]),
                  "key_id": "seed-receipt-1", "key": RECEIPT_KEY.hex(), "payload": payload,
                  "expect": token("sc1", RECEIPT_DOMAIN, RECEIPT_KEY, payload)})

with open(OUT, "w", encoding="utf-8") as f:
    json.dump({"source": "vectors/tools/make_seed_v1.py", "cases": cases}, f, indent=1,
              ensure_ascii=False)
    f.write("\n")
print(f"wrote {len(cases)} cases to {os.path.normpath(OUT)}")
