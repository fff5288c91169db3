"""Writes vectors/synchro-v1.json: the repository's own conformance cases for the schema
evolution commands (classify, connect-dispatch, migration-plan).

Expected outputs are written by hand below from the rules of spec 000/003 and
docs/protocol-decisions.md; manifest hashes and canonical bodies are computed here with
Python's json and hashlib (for these ASCII-only manifests json.dumps(sort_keys=True,
separators=(",", ":")) is exactly RFC 8785), independently of the Rust code under test.
Run: python3 vectors/tools/make_synchro_v1.py  (rewrites the file; review the diff).
"""
import copy, hashlib, json, os

OUT = os.path.join(os.path.dirname(__file__), "..", "synchro-v1.json")
DOMAIN = b"synchro:v3:schema-manifest:v1\x00"


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def body(m):
    b = copy.deepcopy(m)
    b.pop("schema_hash", None)
    b["tables"].sort(key=lambda t: t["table_id"])
    for t in b["tables"]:
        t["fields"].sort(key=lambda f: f["field_id"])
        t["indexes"].sort(key=lambda i: i["index_id"])
    return canonical(b)


def finish(m):
    m["schema_hash"] = hashlib.sha256(DOMAIN + body(m).encode()).hexdigest()
    return m


def ref(m):
    return {"version": m["schema_version"], "hash": m["schema_hash"]}


def field(fid, name, ty, nullable, writable, **extra):
    return dict(field_id=fid, name=name, type=ty, nullable=nullable, writable=writable, **extra)


LIFECYCLE = {"created_at_field_id": None, "updated_at_field_id": None, "deleted_at_field_id": None}


def table(tid, name, composition, pk, fields, indexes=()):
    return dict(table_id=tid, relation_id="rel_" + tid[4:], name=name, composition=composition,
                primary_key_field_id=pk, lifecycle=dict(LIFECYCLE), fields=list(fields), indexes=list(indexes))


def manifest(version, parent, cls, floor, tables):
    return finish(dict(schema_version=version, parent_schema=ref(parent) if parent else None,
                       transition_class=cls, compatibility_floor=floor, tables=copy.deepcopy(tables)))


items = table("tbl_items", "items", "single_scope", "fld_item_id", [
    field("fld_item_id", "id", "string", False, False),
    field("fld_item_label", "label", "string", True, True),
    field("fld_item_qty", "qty", "int", False, True),
])
tags = table("tbl_tags", "tags", "multi_scope", "fld_tag_id", [
    field("fld_tag_id", "id", "int64", False, False),
    field("fld_tag_name", "name", "string", True, True),
])
M1 = manifest(1, None, "initial", 1, [items, tags])
items2 = copy.deepcopy(items)
items2["fields"].append(field("fld_item_note", "note", "string", True, True))
items2["indexes"].append(dict(index_id="idx_items_label", name="idx_items_label", field_ids=["fld_item_label"], unique=False))
M2 = manifest(2, M1, "class_2", 1, [items2, tags])
tags3 = copy.deepcopy(tags)
tags3["composition"] = "single_scope"
M3 = manifest(3, M2, "class_3", 3, [items2, tags3])
extra = table("tbl_extra", "extra", "single_scope", "fld_extra_id", [field("fld_extra_id", "id", "int", False, False)])
M4 = manifest(4, M3, "class_2", 3, [items2, tags3, extra])
M5 = manifest(5, M4, "class_4", 5, [items2, extra])
M1_SAME = manifest(2, M1, "class_2", 1, [items, tags])  # same tables as M1
dec = lambda p, s: table("tbl_money", "money", "single_scope", "fld_m_id", [
    field("fld_m_id", "id", "int", False, False), field("fld_m_amount", "amount", "decimal", False, True, precision=p, scale=s)])
D1 = manifest(1, None, "initial", 1, [dec(10, 2)])
D2_NARROW = manifest(2, D1, "class_4", 2, [dec(10, 3)])
D2_WIDE = manifest(2, D1, "class_2", 1, [dec(12, 3)])

j = lambda m: json.dumps(m)
cases = []


def case(cid, command, inp, expect):
    cases.append({"id": cid, "command": command, "input": inp, "expect": expect})


# ---- classify ----
def classify(cid, parent, child, facts, cls, tables):
    inp = {"parent_manifest_json": j(parent), "child_manifest_json": j(child)}
    if facts is not None:
        inp["facts"] = facts
    exp = {"valid": True, "class": cls, "affected_tables": tables} if cls else {"valid": False}
    case(cid, "classify", inp, exp)


classify("CL-01", M1, M2, {"added_fields_without_history": [{"table_id": "tbl_items", "field_id": "fld_item_note"}]}, "class_2", ["tbl_items"])
classify("CL-02", M1, M2, None, "class_3", ["tbl_items"])
classify("CL-03", M2, M3, {}, "class_3", ["tbl_tags"])
classify("CL-04", M3, M4, {"empty_added_tables": ["tbl_extra"]}, "class_2", ["tbl_extra"])
classify("CL-05", M3, M4, None, "class_3", ["tbl_extra"])
classify("CL-06", M4, M5, None, "class_4", ["tbl_tags"])
classify("CL-07", M1, M1_SAME, None, "class_1", [])
classify("CL-08", D1, D2_NARROW, None, "class_4", ["tbl_money"])
classify("CL-09", D1, D2_WIDE, None, "class_2", ["tbl_money"])
classify("CL-10", M1, M2, {"empty_added_tables": ["tbl_nope"]}, None, None)
classify("CL-11", M2, M2, {"materialization_changed": ["tbl_tags"]}, "class_3", ["tbl_tags"])

# ---- connect-dispatch ----
HISTORY = [j(m) for m in (M1, M2, M3, M4)]
TRANSITIONS = [{"version": 3, "hash": M3["schema_hash"], "scopes": ["team:z", "team:b"]}]
FRESH = {"version": 0, "hash": ""}


def dispatch(cid, request, expect, history=HISTORY, known=True, assigned=(), presented=(), stale=(), runtime=True):
    inp = {"request": request, "manifests": history, "identity_known": known, "transition_scopes": TRANSITIONS,
           "assigned_scopes": list(assigned), "presented_cursor_scopes": list(presented),
           "stale_cursor_scopes": list(stale)}
    if not runtime:
        inp["client_runtime_supported"] = False
    case(cid, "connect-dispatch", inp, dict(valid=True, **expect))


req = lambda schema, gen=7, reset=None, pv=3: {k: v for k, v in
      {"protocol_version": pv, "schema": schema, "client_generation": gen, "schema_reset": reset}.items() if v is not None}
H = "ab" * 32
dispatch("CD-01", req(ref(M4), pv=2), {"status": 426, "code": "upgrade_required"})
dispatch("CD-02", req(FRESH, gen=None), {"status": 200, "action": "replace", "scope_cursor_updates": {}}, known=False, assigned=["team:a"])
dispatch("CD-03", req(FRESH), {"status": 400, "code": "invalid_schema_reference"}, known=False)
dispatch("CD-04", req(FRESH, gen=None), {"status": 400, "code": "invalid_schema_reference"}, known=True)
dispatch("CD-05", req(ref(M4)), {"status": 200, "action": "none", "scope_cursor_updates": {}}, assigned=["team:a"], presented=["team:a"])
dispatch("CD-06", req(ref(M3)), {"status": 200, "action": "replace", "scope_cursor_updates": {"team:a": "reissue", "team:b": "reissue"}},
         assigned=["team:a", "team:b"], presented=["team:a", "team:b"])
dispatch("CD-07", req(ref(M2)), {"status": 200, "action": "rebuild_local", "affected_scopes": ["team:b"],
         "scope_cursor_updates": {"team:a": "reissue", "team:b": None}}, assigned=["team:a", "team:b"], presented=["team:a", "team:b"])
dispatch("CD-08", req(ref(M1)), {"status": 200, "action": "replace", "scope_cursor_updates": {"team:a": None}},
         assigned=["team:a"], presented=["team:a"], stale=["team:a"])
dispatch("CD-09", req({"version": 9, "hash": H}), {"status": 200, "action": "unsupported", "reason": "unknown_schema_lineage"}, assigned=["team:a"])
dispatch("CD-10", req({"version": 0, "hash": H}), {"status": 400, "code": "invalid_schema_reference"})
dispatch("CD-11", req({"version": 2, "hash": M2["schema_hash"].upper()}), {"status": 400, "code": "invalid_schema_reference"})
dispatch("CD-12", req({"version": 2, "hash": ""}), {"status": 400, "code": "invalid_schema_reference"})
dispatch("CD-13", req({"version": 9007199254740992, "hash": H}), {"status": 400, "code": "invalid_schema_reference"})
dispatch("CD-14", req({"version": 3, "hash": H[:63]}), {"status": 400, "code": "invalid_schema_reference"})
dispatch("CD-15", req(ref(M1), reset=True), {"status": 200, "action": "rebuild_local", "affected_scopes": ["team:a", "team:z"],
         "scope_cursor_updates": {"team:a": None}}, assigned=["team:z", "team:a"], presented=["team:a"])
dispatch("CD-16", req({"version": 9, "hash": H}, reset=True), {"status": 200, "action": "replace", "scope_cursor_updates": {}})
dispatch("CD-17", req(ref(M4)), {"status": 200, "action": "unsupported", "reason": "incompatible_schema_transition"},
         history=HISTORY + [j(M5)], assigned=["team:a"])
dispatch("CD-18", req(ref(M2), gen=None), {"status": 400, "code": "invalid_schema_reference"})
dispatch("CD-19", req(ref(M4)), {"status": 426, "code": "upgrade_required"}, runtime=False)
dispatch("CD-20", req(FRESH, gen=None, reset=True), {"status": 400, "code": "invalid_schema_reference"}, known=False)

# ---- migration-plan ----
def q(name):
    return '"' + name.replace('"', '""') + '"'


def set_schema(m):
    return ('INSERT OR REPLACE INTO "_synchro_schema" ("id", "version", "hash", "body") VALUES (1, %d, \'%s\', \'%s\')'
            % (m["schema_version"], m["schema_hash"], body(m).replace("'", "''")))


def prov(tid, composition, key):
    p = "_synchro_provenance:" + tid
    if composition == "single_scope":
        t = 'CREATE TABLE %s ("pk" %s NOT NULL PRIMARY KEY, "scope_id" TEXT NOT NULL) STRICT, WITHOUT ROWID' % (q(p), key)
    else:
        t = 'CREATE TABLE %s ("pk" %s NOT NULL, "scope_id" TEXT NOT NULL, PRIMARY KEY ("pk", "scope_id")) STRICT, WITHOUT ROWID' % (q(p), key)
    return [t, 'CREATE INDEX %s ON %s ("scope_id")' % (q(p + ":scope"), q(p))]


SCHEMA_DDL = ('CREATE TABLE "_synchro_schema" ("id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" = 1), "version" INTEGER NOT NULL, '
              '"hash" TEXT NOT NULL, "body" TEXT NOT NULL) STRICT')
ITEMS_DDL = ('CREATE TABLE "items" ("id" TEXT NOT NULL PRIMARY KEY, "label" TEXT, '
             '"qty" INTEGER CHECK ("qty" BETWEEN -2147483648 AND 2147483647)) STRICT')
TAGS_DDL = 'CREATE TABLE "tags" ("id" INTEGER NOT NULL PRIMARY KEY, "name" TEXT) STRICT'


def plan(cid, source, target, reset, mode, statements):
    inp = {"source_manifest_json": j(source) if source else None, "target_manifest_json": j(target)}
    if reset:
        inp["reset"] = True
    exp = {"valid": True, "mode": mode, "statements": statements} if mode else {"valid": False}
    case(cid, "migration-plan", inp, exp)


plan("MP-01", None, M1, False, "install",
     [SCHEMA_DDL, ITEMS_DDL] + prov("tbl_items", "single_scope", "TEXT") + [TAGS_DDL] + prov("tbl_tags", "multi_scope", "INTEGER") + [set_schema(M1)])
plan("MP-02", M1, M2, False, "migrate",
     ['ALTER TABLE "items" ADD COLUMN "note" TEXT', 'CREATE INDEX "idx_items_label" ON "items" ("label")', set_schema(M2)])
plan("MP-03", M2, M3, False, "migrate",
     ['DROP TABLE "_synchro_provenance:tbl_tags"'] + prov("tbl_tags", "single_scope", "INTEGER") + [set_schema(M3)])
plan("MP-04", M3, M4, False, "migrate",
     ['CREATE TABLE "extra" ("id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" BETWEEN -2147483648 AND 2147483647)) STRICT']
     + prov("tbl_extra", "single_scope", "INTEGER") + [set_schema(M4)])
plan("MP-05", M4, M5, False, None, None)
plan("MP-06", M4, M5, True, "reset", ['DROP TABLE "_synchro_provenance:tbl_tags"', 'DROP TABLE "tags"', set_schema(M5)])
plan("MP-07", D1, D2_WIDE, False, "migrate", [set_schema(D2_WIDE)])
plan("MP-08", D1, D2_NARROW, True, "reset", [
    'CREATE TABLE "_synchro_rebuild:money" ("amount" TEXT, "id" INTEGER NOT NULL PRIMARY KEY CHECK ("id" BETWEEN -2147483648 AND 2147483647)) STRICT',
    'INSERT INTO "_synchro_rebuild:money" ("id") SELECT "id" FROM "money"',
    'DROP TABLE "money"', 'ALTER TABLE "_synchro_rebuild:money" RENAME TO "money"', set_schema(D2_NARROW)])

with open(OUT, "w") as f:
    json.dump({"cases": cases}, f, indent=1, ensure_ascii=False)
    f.write("\n")
print(f"wrote {len(cases)} cases to {os.path.normpath(OUT)}")
