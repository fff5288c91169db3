-- synchro install 12: source values no portable type can hold are refused where they are
-- written, never left to block capture for every relation.
-- Spec 000 "Portable Type System", "Canonical Wire Values"; spec 001 "Portable type system
-- and wire JSON".
--
-- Capture converts each source value with `text_to_wire` (server-native/src/capture/values.rs)
-- and blocks on one it cannot represent; the change stays in the slot, so deleting the row
-- does not help. These values are exactly:
--   float (float4, float8)       NaN, Infinity, -Infinity
--   decimal (numeric(p,s))       NaN (a constrained numeric cannot hold an infinity)
--   date                         infinity, -infinity, BC dates, years after 9999
--   datetime (timestamptz)       the same, evaluated in UTC ('0001-01-01 00:30+01' is 1 BC)
--   datetime (timestamp)         the same, as written
--   time                         24:00:00
--   json (json, jsonb)           outside I-JSON as protocol/src/jcs.rs `canonicalize` accepts
--                                it: a number written as an integer beyond +-(2^53-1), one not
--                                finite as binary64, one whose RFC 8785 serialization is such an
--                                integer (jsonb prints 1e21 as 1000000000000000000000); nesting
--                                deeper than 128; and for json (kept verbatim) also duplicate
--                                member names and lone surrogate escapes.
--   json (an array)              a lower bound other than 1 ('[0:1]={1,2}': JSON has none),
--                                and any element its element type refuses above
-- Every other mapped type (string, int, int64, boolean, bytes, every key type) has no such
-- value. Domains are checked as their base type.
--
-- The fence trigger (31_fences) carries, after (relation_id, kind, key column), the mode of
-- the row document it reads ('jsonb': to_jsonb of the row; 'json': row_to_json, so json
-- columns stay verbatim) and one (column, field_id, check) triple per column that can hold
-- such a value. A write of one is refused with SQLSTATE 22SY1 and the message
--   unrepresentable_value: relation <relation_id> field <field_id>[, ...] cannot hold this
--   value in its portable type
-- (DETAIL {"error":{"code":"unrepresentable_value","relation_id","field_ids"}}); never the
-- value. Stored generated columns are computed after BEFORE triggers, so their checks run in
-- an AFTER ROW trigger synchro_source_generated_values, present only when such a column
-- exists. Registration scans the existing rows of each checked column and refuses the
-- relation with invalid_registration, reason unrepresentable_value and the field ID. A push
-- whose write is refused (or fails with any other data exception, such as jsonb's \u0000)
-- gets status invalid_value from synchro_push_write_batch (52_push).

-- The check a value of a base type needs; NULL when none can fail.
CREATE FUNCTION synchro.synchro_scalar_check_kind(p_type oid) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT CASE p_type
        WHEN 'float4'::regtype THEN 'float' WHEN 'float8'::regtype THEN 'float'
        WHEN 'numeric'::regtype THEN 'decimal' WHEN 'date'::regtype THEN 'date'
        WHEN 'timestamptz'::regtype THEN 'datetime' WHEN 'timestamp'::regtype THEN 'datetime'
        WHEN 'time'::regtype THEN 'time'
        WHEN 'jsonb'::regtype THEN 'jsonb' WHEN 'json'::regtype THEN 'json'
    END
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_scalar_check_kind(oid) FROM PUBLIC;

-- The check a column needs, from its SQL type seen through domains and the zone a timestamp
-- (without time zone) column is read in (p_zone, synchro_column_zone); NULL when none can fail
-- (or the column has no portable type, or is a string). An array's is 'array' (its lower
-- bounds), with ':<kind>' when its elements need one; a timestamp read in a zone's is
-- 'zoned:<zone>'.
CREATE FUNCTION synchro.synchro_value_check_kind(p_portable_type text, p_type oid, p_zone text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_type oid := (synchro.synchro_base_type(p_type, -1)).base_type;
    v_element oid := synchro.synchro_array_element(v_type);
BEGIN
    IF p_portable_type IS NULL OR p_portable_type = 'string' THEN
        RETURN NULL;
    ELSIF v_type = 'timestamp'::regtype AND p_zone IS NOT NULL THEN
        RETURN 'zoned:' || p_zone;
    ELSIF v_element IS NOT NULL THEN
        RETURN 'array' || coalesce(':' || synchro.synchro_scalar_check_kind(
            (synchro.synchro_base_type(v_element, -1)).base_type), '');
    END IF;
    RETURN synchro.synchro_scalar_check_kind(v_type);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_value_check_kind(text, oid, text) FROM PUBLIC;

-- Whether a timestamp read in zone p_zone is one capture cannot carry: a local time the zone
-- skips (a daylight-saving gap: it would come back an hour off), or one whose UTC instant is
-- outside years 1 to 9999 (or infinite).
CREATE FUNCTION synchro.synchro_zoned_refused(p_value timestamp, p_zone text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp SET TimeZone = 'UTC' AS $$
DECLARE
    v_at timestamptz;
BEGIN
    IF p_value IS NULL THEN
        RETURN false;
    END IF;
    v_at := p_value AT TIME ZONE p_zone;
    RETURN (v_at AT TIME ZONE p_zone) IS DISTINCT FROM p_value
        OR synchro.synchro_scalar_refused('datetime', to_jsonb(v_at) #>> '{}');
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_zoned_refused(timestamp, text) FROM PUBLIC;

-- Whether the JSON text of a scalar (as to_jsonb gives it, with TimeZone = UTC) is a value of
-- kind p_kind that its portable type cannot hold, as a boolean SQL expression over the text
-- expression p_expr (the registration's scan inlines it: one call per row of a function with
-- a SET clause was most of that scan). to_jsonb writes NaN and infinities as strings, dates
-- and times in XSD form: 'infinity', '0044-03-15 BC', '10000-01-01',
-- '2024-01-01T00:00:00+00:00 BC', '24:00:00'.
CREATE FUNCTION synchro.synchro_scalar_refused_sql(p_kind text, p_expr text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT format('coalesce(%s, false)', CASE p_kind
        WHEN 'float' THEN format('%s IN (''NaN'', ''Infinity'', ''-Infinity'')', p_expr)
        WHEN 'decimal' THEN format('%s IN (''NaN'', ''Infinity'', ''-Infinity'')', p_expr)
        WHEN 'date' THEN format('length(%s) <> 10', p_expr)
        WHEN 'datetime' THEN format('substr(%1$s, 5, 1) <> ''-'' OR %1$s LIKE ''%% BC''', p_expr)
        WHEN 'time' THEN format('left(%s, 2) = ''24''', p_expr)
        ELSE 'NULL'
    END)
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_scalar_refused_sql(text, text) FROM PUBLIC;

-- The same test of one value: synchro_scalar_refused_sql evaluated over p_text.
CREATE FUNCTION synchro.synchro_scalar_refused(p_kind text, p_text text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_refused boolean;
BEGIN
    EXECUTE 'SELECT ' || synchro.synchro_scalar_refused_sql(p_kind, '$1') INTO v_refused USING p_text;
    RETURN v_refused;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_scalar_refused(text, text) FROM PUBLIC;

-- Whether a JSON number token (already valid JSON grammar) is outside the I-JSON domain of
-- jcs::canonical_json_number: an integer-form token beyond +-(2^53-1); otherwise a value whose
-- nearest binary64 (ties to even) is not finite (|x| >= 2^1024 - 2^970) or serializes as an
-- integer beyond 2^53-1 (2^53 - 0.5 <= |x| < 10^21 - 2^16, the halfway points to 2^53 and to
-- 1e21). Exact for any token, and never raises.
CREATE FUNCTION synchro.synchro_json_number_refused(p_token text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_parts text[];
    v_digits text;
    v_sig text;
    v_exp text;
    v_e numeric;
    v_abs numeric;
BEGIN
    IF p_token ~ '^-?[0-9]+$' THEN
        v_digits := ltrim(p_token, '-');
        RETURN length(v_digits) > 16 OR (length(v_digits) = 16 AND v_digits::bigint > 9007199254740991);
    END IF;
    v_parts := regexp_match(p_token, '^-?([0-9]+)(?:\.([0-9]+))?(?:[eE]([+-]?[0-9]+))?$');
    IF v_parts IS NULL THEN
        RETURN true; -- not a number token: jcs refuses it as well
    END IF;
    v_digits := v_parts[1] || coalesce(v_parts[2], '');
    v_sig := rtrim(ltrim(v_digits, '0'), '0');
    IF v_sig = '' THEN
        RETURN false; -- zero
    END IF;
    v_exp := ltrim(ltrim(coalesce(v_parts[3], '0'), '+-'), '0');
    IF length(v_exp) > 30 THEN
        RETURN left(v_parts[3], 1) <> '-'; -- beyond every threshold: infinite, or below 1
    END IF;
    -- |x| = 0.<v_sig> x 10^v_e
    v_e := length(v_parts[1]) - (length(v_digits) - length(ltrim(v_digits, '0')))
           + CASE WHEN v_exp = '' THEN 0 ELSE v_exp::numeric END * CASE WHEN left(v_parts[3], 1) = '-' THEN -1 ELSE 1 END;
    IF v_e < 1 THEN
        RETURN false; -- below 1
    END IF;
    IF v_e > 309 THEN
        RETURN true; -- at least 10^309
    END IF;
    IF length(v_sig) > 400 THEN
        -- Digits past the 400th only decide ties no threshold has: keep a sticky nonzero digit.
        v_sig := left(v_sig, 400) || '1';
    END IF;
    v_abs := ('0.' || v_sig || 'e' || v_e::text)::numeric;
    RETURN (v_abs >= 9007199254740991.5 AND v_abs < 999999999999999934464)
        OR v_abs >= 179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_json_number_refused(text) FROM PUBLIC;

-- Whether a jsonb value is outside I-JSON: nesting deeper than 128 (a container at path level
-- 128 or more; the root is level 0 and depth 1) or a number outside the domain. jsonb keeps
-- member names unique and refuses lone surrogates and \u0000 on input.
CREATE FUNCTION synchro.synchro_jsonb_refused(p_value jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT jsonb_path_exists(p_value, 'strict $.**{128 to last} ? (@.type() == "object" || @.type() == "array")')
        OR EXISTS (SELECT 1 FROM jsonb_path_query(p_value,
                       'strict $.** ? (@.type() == "number" && (@ >= 9007199254740991.5 || @ <= -9007199254740991.5))') n
                    WHERE synchro.synchro_json_number_refused(n::text))
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_jsonb_refused(jsonb) FROM PUBLIC;

-- Whether json text has a lone surrogate escape (a high one not directly followed by a low
-- one, or a low one alone). Every backslash of valid JSON starts an escape, so matching
-- escapes left to right (pairs first, the longest match) sees each exactly once.
CREATE FUNCTION synchro.synchro_json_lone_surrogate(p_text text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM regexp_matches(p_text,
        '(\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})|\\.', 'g') m
        WHERE m[2] IS NOT NULL)
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_json_lone_surrogate(text) FROM PUBLIC;

-- json text with every \u0000 escape replaced by the escape of a character the text holds
-- nowhere (so member names stay distinct exactly when they were): PostgreSQL's json functions
-- cannot decode \u0000. NULL in the absurd case that none of the candidates is free.
CREATE FUNCTION synchro.synchro_json_without_nul(p_text text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_lower text := lower(p_text);
    v_cp integer;
    v_escape text;
BEGIN
    FOR v_cp IN SELECT c FROM generate_series(1, 31) c WHERE c NOT IN (8, 9, 10, 12, 13)
                UNION ALL SELECT generate_series(57344, 63743) LOOP
        v_escape := '\u' || lpad(to_hex(v_cp), 4, '0');
        -- Control characters only ever appear escaped in JSON text; others may appear raw.
        IF strpos(v_lower, v_escape) = 0 AND (v_cp < 32 OR strpos(p_text, chr(v_cp)) = 0) THEN
            RETURN regexp_replace(p_text, '(?<!\\)((?:\\\\)*)\\u0000', '\1\' || v_escape, 'g');
        END IF;
    END LOOP;
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_json_without_nul(text) FROM PUBLIC;

-- Whether a json value (text kept verbatim by PostgreSQL) is one jcs::canonicalize refuses:
-- a lone surrogate escape, a duplicate member name (after unescaping), nesting deeper than
-- 128, or a number outside the domain. PostgreSQL's json input already enforces the rest of
-- the grammar exactly as our parser does.
CREATE FUNCTION synchro.synchro_json_text_refused(p_text text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_text text := p_text;
BEGIN
    IF v_text ~ '\\u[dD][89a-fA-F]' AND synchro.synchro_json_lone_surrogate(v_text) THEN
        RETURN true;
    END IF;
    IF strpos(v_text, '\u0000') > 0 THEN
        v_text := synchro.synchro_json_without_nul(v_text);
        IF v_text IS NULL THEN
            RETURN true;
        END IF;
    END IF;
    -- Without an object, more than 128 brackets, or a long or exponent number there is
    -- nothing to refuse.
    IF strpos(v_text, '{') = 0 AND length(v_text) - length(replace(v_text, '[', '')) <= 128
       AND v_text !~ '[0-9]{16}|[0-9][eE]' THEN
        RETURN false;
    END IF;
    RETURN EXISTS (
        WITH RECURSIVE items(value, kind, level) AS (
            SELECT v_text::json, json_typeof(v_text::json), 0
          UNION ALL
            SELECT c.value, json_typeof(c.value), i.level + 1
              FROM items i
              CROSS JOIN LATERAL (
                  SELECT e.value FROM json_each(CASE WHEN i.kind = 'object' THEN i.value ELSE '{}' END) e
                  UNION ALL
                  SELECT a.value FROM json_array_elements(CASE WHEN i.kind = 'array' THEN i.value ELSE '[]' END) a
              ) c
             WHERE i.kind IN ('object', 'array') AND i.level < 128
        )
        SELECT 1 FROM items i
         WHERE CASE i.kind
                   WHEN 'number' THEN synchro.synchro_json_number_refused(btrim(i.value::text, E' \t\n\r'))
                   WHEN 'array' THEN i.level >= 128
                   WHEN 'object' THEN i.level >= 128
                       OR (SELECT count(*) <> count(DISTINCT e.key COLLATE "C") FROM json_each(i.value) e)
                   ELSE false END);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_json_text_refused(text) FROM PUBLIC;

-- Whether an array is one capture cannot carry as a json array: a lower bound other than 1
-- (JSON has none), or an element its element check kind (p_kind; NULL: none) refuses.
CREATE FUNCTION synchro.synchro_array_refused(p_value anyarray, p_kind text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp SET TimeZone = 'UTC' AS $$
DECLARE
    v_text text;
    v_json jsonb;
BEGIN
    IF p_value IS NULL OR cardinality(p_value) = 0 THEN
        RETURN false;
    END IF;
    IF array_dims(p_value) !~ '^(\[1:[0-9]+\])+$' THEN
        RETURN true;
    END IF;
    IF p_kind IS NULL THEN
        RETURN false;
    END IF;
    FOR v_text, v_json IN SELECT e::text, to_jsonb(e) FROM unnest(p_value) AS u(e) LOOP
        CONTINUE WHEN v_text IS NULL;
        IF (CASE p_kind
                WHEN 'json' THEN synchro.synchro_json_text_refused(v_text)
                WHEN 'jsonb' THEN synchro.synchro_jsonb_refused(v_json)
                ELSE synchro.synchro_scalar_refused(p_kind, v_json #>> '{}') END) THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_array_refused(anyarray, text) FROM PUBLIC;

-- The key's text form (as the fence records it) and the field IDs of p_row's values that the
-- portable types cannot hold (checked only when p_check). p_args is the fence's argument
-- list: relation_id, kind, key column, document mode, then (column, field_id, check) triples.
-- Runs in UTC: to_jsonb writes a timestamptz in the session's time zone.
CREATE FUNCTION synchro.synchro_row_check(p_row record, p_args text[], p_check boolean,
    OUT key_text text, OUT refused text[])
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp SET TimeZone = 'UTC' AS $$
DECLARE
    v_lo integer := array_lower(p_args, 1);
    v_hi integer := array_upper(p_args, 1);
    v_key text := p_args[array_lower(p_args, 1) + 2];
    v_doc jsonb;
    v_jdoc json;
    v_cols text;
    v_text text;
    v_i integer;
    v_col text;
    v_field text;
    v_kind text;
    v_value jsonb;
    v_bad boolean;
BEGIN
    refused := '{}';
    IF p_args[v_lo + 3] IS DISTINCT FROM 'json' THEN
        v_doc := to_jsonb(p_row);
    ELSE
        -- json columns stay verbatim in row_to_json; to_jsonb would reparse (and dedupe) them.
        v_jdoc := row_to_json(p_row);
        IF strpos(v_jdoc::text, '\u0000') > 0 OR v_jdoc::text ~ '\\u[dD][89a-fA-F]' THEN
            -- Escapes PostgreSQL's json functions cannot (or may not) decode: check each json
            -- column from its own text and read the other columns through jsonb.
            v_jdoc := NULL;
            v_cols := quote_ident(v_key);
            v_i := v_lo + 4;
            WHILE v_i + 2 <= v_hi LOOP
                v_col := p_args[v_i]; v_field := p_args[v_i + 1]; v_kind := p_args[v_i + 2];
                IF v_kind <> 'json' THEN
                    v_cols := v_cols || ', ' || quote_ident(v_col);
                ELSIF p_check THEN
                    EXECUTE format('SELECT ($1).%I::text', v_col) INTO v_text USING p_row;
                    IF synchro.synchro_json_text_refused(v_text) THEN
                        refused := refused || v_field;
                    END IF;
                END IF;
                v_i := v_i + 3;
            END LOOP;
            EXECUTE format('SELECT to_jsonb(x) FROM (SELECT %s FROM (SELECT ($1).*) r) x', v_cols)
               INTO v_doc USING p_row;
        END IF;
    END IF;
    key_text := CASE WHEN v_doc IS NOT NULL THEN v_doc ->> v_key ELSE v_jdoc ->> v_key END;
    IF NOT p_check THEN
        RETURN;
    END IF;
    -- The checks of synchro_scalar_refused and synchro_jsonb_refused, inline where they are
    -- cheap (a call of a function with a SET clause costs more than the check).
    v_i := v_lo + 4;
    WHILE v_i + 2 <= v_hi LOOP
        v_col := p_args[v_i]; v_field := p_args[v_i + 1]; v_kind := p_args[v_i + 2];
        IF v_kind LIKE 'array%' THEN
            EXECUTE format('SELECT synchro.synchro_array_refused(($1).%I, %L)', v_col, nullif(substr(v_kind, 7), ''))
               INTO v_bad USING p_row;
        ELSIF v_kind LIKE 'zoned:%' THEN
            EXECUTE format('SELECT synchro.synchro_zoned_refused(($1).%I, %L)', v_col, substr(v_kind, 7))
               INTO v_bad USING p_row;
        ELSIF v_kind = 'json' THEN
            v_bad := v_jdoc IS NOT NULL AND synchro.synchro_json_text_refused((v_jdoc -> v_col)::text);
        ELSIF v_kind = 'jsonb' THEN
            v_value := CASE WHEN v_doc IS NOT NULL THEN v_doc -> v_col ELSE (v_jdoc -> v_col)::jsonb END;
            v_bad := jsonb_path_exists(v_value, 'strict $.**{128 to last} ? (@.type() == "object" || @.type() == "array")')
                OR (jsonb_path_exists(v_value,
                        'strict $.** ? (@.type() == "number" && (@ >= 9007199254740991.5 || @ <= -9007199254740991.5))')
                    AND synchro.synchro_jsonb_refused(v_value));
        ELSE
            v_text := CASE WHEN v_doc IS NOT NULL THEN v_doc ->> v_col ELSE v_jdoc ->> v_col END;
            v_bad := CASE v_kind
                WHEN 'float' THEN v_text IN ('NaN', 'Infinity', '-Infinity')
                WHEN 'decimal' THEN v_text IN ('NaN', 'Infinity', '-Infinity')
                WHEN 'date' THEN length(v_text) <> 10
                WHEN 'datetime' THEN substr(v_text, 5, 1) <> '-' OR v_text LIKE '% BC'
                WHEN 'time' THEN left(v_text, 2) = '24'
            END;
        END IF;
        IF v_bad THEN
            refused := refused || v_field;
        END IF;
        v_i := v_i + 3;
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_row_check(record, text[], boolean) FROM PUBLIC;

-- The refusal: SQLSTATE 22SY1 (class 22, data exception), naming the relation and fields.
CREATE FUNCTION synchro.synchro_unrepresentable_error(p_relation_id text, p_field_ids text[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'unrepresentable_value: relation % field % cannot hold this value in its portable type',
        p_relation_id, array_to_string(p_field_ids, ', ')
        USING ERRCODE = '22SY1',
              DETAIL = jsonb_build_object('error', jsonb_build_object('code', 'unrepresentable_value',
                  'relation_id', p_relation_id, 'field_ids', to_jsonb(p_field_ids)))::text,
              HINT = 'A synced value must be finite, dated within years 1 to 9999 in UTC, before midnight, '
                     'and JSON within I-JSON; see docs/operator.md in the synchro repository.';
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_unrepresentable_error(text, text[]) FROM PUBLIC;

-- A recorded field that needs a check refreshes the fence and refuses the registration when
-- an existing row already holds such a value (registration runs as synchro_owner, which may
-- act for the relation's owner and holds its lock from the fence's creation on).
CREATE FUNCTION synchro.synchro_fields_value_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp SET TimeZone = 'UTC' AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_kind text;
    v_relkind "char";
    v_predicate text;
    v_found boolean;
BEGIN
    IF current_setting('synchro.activating', true) = 'on' THEN
        RETURN NULL; -- a staged generation's fields, checked when it was recorded (33_reconfigure)
    END IF;
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = NEW.relation_id;
    SELECT synchro.synchro_value_check_kind(NEW.portable_type, a.atttypid,
               synchro.synchro_column_zone(v_rel.timestamp_zones, NEW.column_name)), c.relkind
      INTO v_kind, v_relkind
      FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
     WHERE a.attrelid = v_rel.physical_relation_oid AND a.attnum = NEW.attnum;
    IF v_kind IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM synchro.synchro_create_fence(NEW.relation_id);
    v_predicate := CASE
        WHEN v_kind LIKE 'array%' THEN format('synchro.synchro_array_refused(t.%I, %L)', NEW.column_name,
                                              nullif(substr(v_kind, 7), ''))
        WHEN v_kind LIKE 'zoned:%' THEN format('synchro.synchro_zoned_refused(t.%I, %L)', NEW.column_name,
                                               substr(v_kind, 7))
        ELSE CASE v_kind
        WHEN 'json' THEN format('synchro.synchro_json_text_refused(t.%I::text)', NEW.column_name)
        WHEN 'jsonb' THEN format('synchro.synchro_jsonb_refused(t.%I)', NEW.column_name)
        -- Inline (synchro_scalar_refused_sql): a function call per row was most of the scan.
        ELSE synchro.synchro_scalar_refused_sql(v_kind, format('(to_jsonb(t.%I) #>> ''{}'')', NEW.column_name)) END
        END;
    -- A partitioned table's rows are in its partitions; a plain table's inheritance children
    -- are not registered.
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s%I.%I t WHERE %s)',
                   CASE WHEN v_relkind = 'p' THEN '' ELSE 'ONLY ' END,
                   v_rel.physical_schema, v_rel.physical_relation, v_predicate)
       INTO v_found;
    IF v_found THEN
        -- Names the column, and only IDs already assigned before this transaction (spec 000:
        -- "present only when already assigned"): a registration's relation has no registry
        -- generation until it completes, and a field inserted here is new unless it is a
        -- retained field a reconfiguration restages.
        PERFORM synchro.synchro_registration_error('unrepresentable_value',
            CASE WHEN EXISTS (SELECT 1 FROM synchro.registry_generations g WHERE g.relation_id = NEW.relation_id)
                 THEN NEW.relation_id END,
            CASE WHEN TG_TABLE_NAME = 'pending_fields'
                      AND EXISTS (SELECT 1 FROM synchro.fields f WHERE f.field_id = NEW.field_id)
                 THEN NEW.field_id END,
            jsonb_build_object('column', NEW.column_name));
    END IF;
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_fields_value_trigger() FROM PUBLIC;
CREATE TRIGGER synchro_fields_value_checks AFTER INSERT ON synchro.fields
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_fields_value_trigger();
