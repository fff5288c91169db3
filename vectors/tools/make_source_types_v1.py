"""Writes vectors/source-types-v1.json: PostgreSQL column types that application schemas use
(ORM defaults: timestamp without time zone, enums, domains, citext, interval, network types,
wide decimals) with a value written in SQL, the portable type registration must give the
column, the canonical wire value capture must produce, and the row digest of a two-field row
holding it.

Expected wire values are written by hand below from PostgreSQL's documented output rules
(ISO DateStyle, IntervalStyle postgres, canonical network text, bpchar padding) and spec 000's
canonical wire forms; row digests are computed here with Python's hashlib and struct from spec
001's typed binary grammar, independently of the Rust code under test.
Run: python3 vectors/tools/make_source_types_v1.py  (rewrites the file; review the diff).
"""
import hashlib, json, os, struct

OUT = os.path.join(os.path.dirname(__file__), "..", "source-types-v1.json")

ROW_ID_DOMAIN = b"synchro:v3:row-identity:v1\x00"
ROW_DIGEST_DOMAIN = b"synchro:v3:row-digest:v1\x00"
TAGS = {"string": 1, "int": 2, "int64": 3, "decimal": 4, "float": 5, "boolean": 6,
        "datetime": 7, "date": 8, "time": 9, "json": 10, "bytes": 11}

SCHEMA_HASH = hashlib.sha256(b"synchro source-types-v1 schema").hexdigest()
TABLE_ID = "tbl_source_types"
KEY_FIELD = "fld_a_id"      # int, value 1
VALUE_FIELD = "fld_b_value"  # the case's column
SERVER_VERSION = "0/16B3748:1"


def u32(n):
    return struct.pack(">I", n)


def u64(n):
    return struct.pack(">Q", n)


def blob(b):
    return u64(len(b)) + b


def text(s):
    return blob(s.encode("utf-8"))


def payload(ty, wire):
    """Spec 001's binary payload of a non-null wire value of portable type ty."""
    if ty in ("string", "decimal", "datetime", "date", "time", "json"):
        return text(wire)
    if ty == "int":
        return struct.pack(">i", wire)
    if ty == "float":
        v = float(wire)
        return struct.pack(">d", 0.0 if v == 0 else v)
    raise ValueError(ty)


def typed(ty, wire):
    if wire is None:
        return bytes([TAGS[ty], 0])
    return bytes([TAGS[ty], 1]) + payload(ty, wire)


def row_digest(ty, wire):
    identity = ROW_ID_DOMAIN + text(TABLE_ID) + text(KEY_FIELD) + typed("int", 1)
    body = u32(2) + text(KEY_FIELD) + typed("int", 1) + text(VALUE_FIELD) + typed(ty, wire)
    data = (ROW_DIGEST_DOMAIN + bytes.fromhex(SCHEMA_HASH) + u64(len(identity)) + identity
            + u64(len(body)) + body + text(SERVER_VERSION))
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj):
    # ASCII-free of numbers beyond the safe range: json.dumps with sorted keys is RFC 8785 here.
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def f32_wire(source):
    """The float wire number of a real value: the nearest binary32, widened, shortest text."""
    return repr(struct.unpack(">f", struct.pack(">f", float(source)))[0])


def case(name, column, value, ty, wire, setup=None, precision=None, scale=None):
    c = {"name": name, "column": column, "value": value, "type": ty}
    if setup:
        c["setup"] = setup
    if precision is not None:
        c["precision"], c["scale"] = precision, scale
    c["wire"] = wire
    c["row_digest"] = row_digest(ty, wire)
    return c


DEC65 = "12345678901234567890123456789012345.123456789012345678901234567891"
CASES = [
    # timestamp without time zone: a datetime read as UTC.
    case("timestamp", "timestamp", "2024-03-01 01:00:00.5", "datetime", "2024-03-01T01:00:00.500000Z"),
    case("timestamp(3) rounds", "timestamp(3)", "2024-12-31 23:59:59.1239", "datetime",
         "2024-12-31T23:59:59.124000Z"),
    case("timestamp first year", "timestamp", "0001-01-01 00:00:00", "datetime", "0001-01-01T00:00:00.000000Z"),
    case("timestamp last microsecond", "timestamp", "9999-12-31 23:59:59.999999", "datetime",
         "9999-12-31T23:59:59.999999Z"),
    case("timestamp leap day", "timestamp(0)", "2020-02-29 12:34:56.7", "datetime", "2020-02-29T12:34:57.000000Z"),
    # enums: the label.
    case("enum", "mood", "happy", "string", "happy",
         setup="CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')"),
    case("enum non-ascii label", "mood2", "très bien", "string", "très bien",
         setup="CREATE TYPE mood2 AS ENUM ('très bien', 'bof')"),
    # domains: the base type's portable type.
    case("domain over text", "email", "a@example.com", "string", "a@example.com",
         setup="CREATE DOMAIN email AS text CHECK (VALUE LIKE '%@%')"),
    case("domain over numeric(10,2)", "money2", "12.50", "decimal", "12.5",
         setup="CREATE DOMAIN money2 AS numeric(10, 2)", precision=10, scale=2),
    case("domain over real", "ratio", "1.1", "float", float(f32_wire("1.1")),
         setup="CREATE DOMAIN ratio AS real"),
    case("domain over a domain", "shortname", "x", "string", "x",
         setup="CREATE DOMAIN nonempty AS text CHECK (VALUE <> ''); "
               "CREATE DOMAIN shortname AS nonempty CHECK (length(VALUE) < 20)"),
    case("domain over timestamp(0)", "happened", "2021-06-30 23:59:59.4", "datetime",
         "2021-06-30T23:59:59.000000Z", setup="CREATE DOMAIN happened AS timestamp(0)"),
    case("domain over jsonb", "doc", '{"b": 1, "a": [true, null, "é"]}', "json",
         canonical_json({"a": [True, None, "é"], "b": 1}), setup="CREATE DOMAIN doc AS jsonb"),
    # text-like types.
    case("citext", "citext", "MiXeD Case", "string", "MiXeD Case",
         setup="CREATE EXTENSION IF NOT EXISTS citext"),
    case("varchar(5)", "varchar(5)", "abc", "string", "abc"),
    case("char(5) keeps its padding", "char(5)", "ab", "string", "ab   "),
    case("interval", "interval", "1 year 2 months 3 days 04:05:06.5", "string", "1 year 2 mons 3 days 04:05:06.5"),
    case("negative interval", "interval", "-1 day +02:00", "string", "-1 days +02:00:00"),
    case("inet", "inet", "192.168.0.1/24", "string", "192.168.0.1/24"),
    case("inet v6 host", "inet", "0:0:0:0:0:0:0:1", "string", "::1"),
    case("cidr", "cidr", "10.1/16", "string", "10.1.0.0/16"),
    case("macaddr", "macaddr", "08-00-2B-01-02-03", "string", "08:00:2b:01:02:03"),
    case("macaddr8", "macaddr8", "08002b0102030405", "string", "08:00:2b:01:02:03:04:05"),
    # decimals at Prisma's DECIMAL(65,30) limits: 65 significant and 30 fractional digits.
    case("decimal(65,30) 65 digits", "numeric(65,30)", DEC65, "decimal", DEC65, precision=65, scale=30),
    case("decimal(65,30) smallest", "numeric(65,30)", "-0.000000000000000000000000000001", "decimal",
         "-0.000000000000000000000000000001", precision=65, scale=30),
    case("decimal(65,30) largest", "numeric(65,30)", "9" * 35 + "." + "9" * 30, "decimal", "9" * 35 + "." + "9" * 30,
         precision=65, scale=30),
    case("decimal(65,30) trailing zeros", "numeric(65,30)", "100.500", "decimal", "100.5", precision=65, scale=30),
    # arrays: a json array of the elements' wire values, dimensions nested, NULL kept.
    case("text[]", "text[]", '{a,"b c",NULL,"q\\"uote","é",""}', "json",
         canonical_json(["a", "b c", None, 'q"uote', "é", ""])),
    case("empty text[]", "text[]", "{}", "json", "[]"),
    case("integer[][]", "integer[]", "{{1,2},{3,NULL}}", "json", "[[1,2],[3,null]]"),
    case("bigint[]", "bigint[]", "{9223372036854775807,-1}", "json", '["9223372036854775807","-1"]'),
    case("numeric(10,2)[]", "numeric(10,2)[]", "{12.50,-0.01,0}", "json", '["12.5","-0.01","0"]'),
    case("timestamp(3)[]", "timestamp(3)[]", '{"2024-03-01 01:00:00.5",NULL}', "json",
         '["2024-03-01T01:00:00.500000Z",null]'),
    case("enum[]", "mood[]", "{happy,sad}", "json", '["happy","sad"]'),
    case("boolean[]", "boolean[]", "{t,f}", "json", "[true,false]"),
    case("real[]", "real[]", "{1.1,-2.5}", "json", "[" + f32_wire("1.1") + ",-2.5]"),
    case("uuid[]", "uuid[]", "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", "json",
         '["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]'),
    case("jsonb[]", "jsonb[]", '{"{\\"b\\": 1, \\"a\\": 2}"}', "json",
         canonical_json([canonical_json({"a": 2, "b": 1})])),
    case("bytea[]", "bytea[]", '{"\\\\x00ff"}', "json", '["AP8"]'),
    case("domain over text[]", "tag_list", "{x,y}", "json", '["x","y"]',
         setup="CREATE DOMAIN tag_list AS text[] CHECK (cardinality(VALUE) < 10)"),
]

assert len(DEC65.replace(".", "")) == 65 and len(DEC65.split(".")[1]) == 30

with open(OUT, "w", encoding="utf-8") as f:
    json.dump({
        "description": "PostgreSQL column types of application schemas: value written in SQL, "
                       "portable type, canonical wire value, and the row digest of "
                       "{fld_a_id: 1 (int key), fld_b_value: wire} in table tbl_source_types",
        "schema_hash": SCHEMA_HASH, "table_id": TABLE_ID, "key_field_id": KEY_FIELD,
        "value_field_id": VALUE_FIELD, "server_version": SERVER_VERSION, "cases": CASES,
    }, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(f"wrote {len(CASES)} cases to {os.path.normpath(OUT)}")
