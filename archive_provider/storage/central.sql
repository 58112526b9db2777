-- hermes-archive central store (format 1): many archives, keyed by (store_id, seq).
--
-- Run by `hermes-archive central init --db URL` as a superuser (or a role that may create
-- roles and is a member of hermes_archive_owner). Idempotent: running it again changes
-- nothing that exists. docs/OPERATIONS.md "Fleet" explains the roles.
--
-- PostgreSQL enforces what it can compute itself: gap-free seq per store, each row's
-- prev_chain equal to the stored chain of the row before, every digest an event names
-- present in payloads, no UPDATE / DELETE / TRUNCATE, and erasure only of payloads an
-- already-shipped erasure event covers. It has no BLAKE3: digests and the chain values
-- themselves are checked by the shipper before sending and by `hermes-archive --db URL
-- verify`, which runs the package's verifier over these rows.

DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'hermes_archive_owner') THEN
        CREATE ROLE hermes_archive_owner NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'hermes_archive_shipper') THEN
        CREATE ROLE hermes_archive_shipper NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'hermes_archive_reader') THEN
        CREATE ROLE hermes_archive_reader NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'hermes_archive_eraser') THEN
        CREATE ROLE hermes_archive_eraser NOLOGIN;
    END IF;
END
$roles$;

CREATE SCHEMA IF NOT EXISTS hermes_archive AUTHORIZATION hermes_archive_owner;
REVOKE ALL ON SCHEMA hermes_archive FROM PUBLIC;
GRANT USAGE ON SCHEMA hermes_archive
    TO hermes_archive_shipper, hermes_archive_reader, hermes_archive_eraser;

SET LOCAL ROLE hermes_archive_owner;
SET LOCAL search_path = pg_catalog, hermes_archive;

CREATE TABLE IF NOT EXISTS hermes_archive.stores (
    store_id       text PRIMARY KEY CHECK (store_id ~ '^[0-9a-f]{32}$'),
    format_version integer NOT NULL CHECK (format_version = 1),
    genesis        text NOT NULL CHECK (genesis ~ '^[0-9a-f]{64}$'),
    -- the store's payload key: central verify needs it to recompute keyed payload digests
    payload_key    text NOT NULL CHECK (payload_key ~ '^[0-9a-f]{64}$'),
    label          text NOT NULL DEFAULT '',
    -- the login role that registered the store; only it (or a role it is granted to)
    -- may append to this store. Set by the server, whatever the client sends.
    shipper        name NOT NULL DEFAULT session_user,
    registered     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS hermes_archive.payloads (
    store_id  text NOT NULL REFERENCES hermes_archive.stores,
    digest    text NOT NULL CHECK (digest ~ '^[0-9a-f]{64}$'),
    body      bytea,                 -- NULL once erased
    erased_by bigint,                -- seq of the erasure event that covered it
    search    tsvector,              -- set by the insert trigger, for full-text search
    PRIMARY KEY (store_id, digest),
    CHECK ((body IS NULL) = (erased_by IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS payloads_search ON hermes_archive.payloads USING gin (search);

CREATE TABLE IF NOT EXISTS hermes_archive.events (
    store_id   text NOT NULL REFERENCES hermes_archive.stores,
    seq        bigint NOT NULL CHECK (seq >= 1),
    time       text NOT NULL,
    type       text NOT NULL,
    session    text NOT NULL,
    key        text NOT NULL,
    identity   text NOT NULL CHECK (identity ~ '^[0-9a-f]{64}$'),
    payload    text NOT NULL CHECK (payload ~ '^[0-9a-f]{64}$'),
    parts      text NOT NULL,
    prev_chain text NOT NULL CHECK (prev_chain ~ '^[0-9a-f]{64}$'),
    chain      text NOT NULL CHECK (chain ~ '^[0-9a-f]{64}$'),
    shipped    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (store_id, seq),
    UNIQUE (identity, store_id),
    FOREIGN KEY (store_id, payload) REFERENCES hermes_archive.payloads (store_id, digest)
);
-- Only the primary key starts with store_id: the insert trigger's lookup of (store_id,
-- seq - 1) runs while a batch's rows are not in the planner's statistics, and an index that
-- also starts with store_id would be scanned for the whole store instead.
CREATE INDEX IF NOT EXISTS events_session ON hermes_archive.events (session, store_id, seq);
CREATE INDEX IF NOT EXISTS events_type ON hermes_archive.events (type, store_id, seq);
CREATE INDEX IF NOT EXISTS events_time ON hermes_archive.events (time);
CREATE INDEX IF NOT EXISTS events_payload ON hermes_archive.events (payload, store_id);
CREATE INDEX IF NOT EXISTS events_parts ON hermes_archive.events USING gin ((parts::jsonb));

-- Appending: the row must continue its store's chain exactly where it stands.
-- Whether the connected login role may append to a store: the role that registered it,
-- or a role that role was granted to (to hand a store over without an UPDATE).
CREATE OR REPLACE FUNCTION hermes_archive.may_ship(p_store_id text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
    SELECT coalesce(bool_or(pg_has_role(session_user, s.shipper, 'MEMBER')), false)
      FROM hermes_archive.stores s WHERE s.store_id = p_store_id
$fn$;

CREATE OR REPLACE FUNCTION hermes_archive.stores_before_insert() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $fn$
BEGIN
    NEW.shipper := session_user;
    NEW.registered := now();
    RETURN NEW;
END
$fn$;

CREATE OR REPLACE FUNCTION hermes_archive.events_before_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
DECLARE
    expected text;
    part     text;
BEGIN
    IF NOT hermes_archive.may_ship(NEW.store_id) THEN
        RAISE EXCEPTION 'store %: % did not register it and may not append to it',
            NEW.store_id, session_user USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.seq = 1 THEN
        SELECT s.genesis INTO expected FROM hermes_archive.stores s
         WHERE s.store_id = NEW.store_id;
    ELSE
        SELECT e.chain INTO expected FROM hermes_archive.events e
         WHERE e.store_id = NEW.store_id AND e.seq = NEW.seq - 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'store %: seq % leaves a gap (seq % is not stored)',
                NEW.store_id, NEW.seq, NEW.seq - 1 USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    IF NEW.prev_chain IS DISTINCT FROM expected THEN
        RAISE EXCEPTION 'store %: seq % does not continue the stored chain (prev_chain differs)',
            NEW.store_id, NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    IF jsonb_typeof(NEW.parts::jsonb) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'store %: seq %: parts is not a JSON array', NEW.store_id, NEW.seq
            USING ERRCODE = 'check_violation';
    END IF;
    -- one point lookup per part (an anti-join gets planned as a scan of the store's payloads)
    FOR part IN SELECT jsonb_array_elements_text(NEW.parts::jsonb) LOOP
        PERFORM 1 FROM hermes_archive.payloads p
         WHERE p.store_id = NEW.store_id AND p.digest = part;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'store %: seq % names part % that was not shipped',
                NEW.store_id, NEW.seq, part USING ERRCODE = 'foreign_key_violation';
        END IF;
    END LOOP;
    NEW.shipped := now();
    RETURN NEW;
END
$fn$;

-- A payload arrives whole; its search vector is computed here, never sent.
CREATE OR REPLACE FUNCTION hermes_archive.payloads_before_insert() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, hermes_archive AS $fn$
BEGIN
    IF NOT hermes_archive.may_ship(NEW.store_id) THEN
        RAISE EXCEPTION 'store %: % did not register it and may not add payloads to it',
            NEW.store_id, session_user USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.body IS NULL OR NEW.erased_by IS NOT NULL THEN
        RAISE EXCEPTION 'store %: payload % arrives without its body', NEW.store_id, NEW.digest
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.search := to_tsvector('english', left(convert_from(NEW.body, 'UTF8'), 100000));
    RETURN NEW;
END
$fn$;

-- Whether the erasure event at (store, seq) lists digest among the payloads it covers.
-- STUB until format v2 (issue 16) defines the `erasure` event: its body is a JSON object
-- whose "covers" member lists the payload digests it erases.
CREATE OR REPLACE FUNCTION hermes_archive.erasure_covers(
    p_store_id text, p_seq bigint, p_digest text
) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, hermes_archive AS $fn$
    SELECT coalesce(bool_or(
               e.payload <> p_digest
               AND convert_from(p.body, 'UTF8')::jsonb -> 'covers' ? p_digest), false)
      FROM hermes_archive.events e
      JOIN hermes_archive.payloads p ON p.store_id = e.store_id AND p.digest = e.payload
     WHERE e.store_id = p_store_id AND e.seq = p_seq AND e.type = 'erasure'
       AND p.body IS NOT NULL
$fn$;

-- The only change a payload row ever takes: its body blanked by a covering erasure.
CREATE OR REPLACE FUNCTION hermes_archive.payloads_before_update() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, hermes_archive AS $fn$
BEGIN
    IF OLD.body IS NOT NULL AND NEW.body IS NULL AND NEW.erased_by IS NOT NULL
       AND NEW.store_id = OLD.store_id AND NEW.digest = OLD.digest
       AND hermes_archive.erasure_covers(NEW.store_id, NEW.erased_by, NEW.digest) THEN
        NEW.search := NULL;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'payloads are immutable; erasure goes through hermes_archive.erase()'
        USING ERRCODE = 'insufficient_privilege';
END
$fn$;

CREATE OR REPLACE FUNCTION hermes_archive.refuse_change() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $fn$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$fn$;

-- Blank every payload the (already shipped) erasure event at (store, seq) covers.
CREATE OR REPLACE FUNCTION hermes_archive.erase(p_store_id text, p_erasure_seq bigint)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
DECLARE
    blanked integer;
BEGIN
    UPDATE hermes_archive.payloads p SET body = NULL, erased_by = p_erasure_seq
     WHERE p.store_id = p_store_id AND p.body IS NOT NULL
       AND hermes_archive.erasure_covers(p_store_id, p_erasure_seq, p.digest);
    GET DIAGNOSTICS blanked = ROW_COUNT;
    RETURN blanked;
END
$fn$;

-- The envelope bytes of a row (docs/FORMAT.md section 4), built by the server itself:
-- to_json(text) writes exactly the canonical text of 2.3 for every string PostgreSQL can
-- hold. Format v2 hashes these bytes into its SHA-256 Merkle leaves; the server will
-- recompute leaves and roots from them and match each shipped signed checkpoint.
CREATE OR REPLACE FUNCTION hermes_archive.envelope(e hermes_archive.events) RETURNS bytea
LANGUAGE sql STABLE SET search_path = pg_catalog AS $fn$
    SELECT convert_to(
        '{"identity":"' || e.identity || '","key":' || e.key || ',"parts":' || e.parts
        || ',"payload":"' || e.payload || '","seq":' || e.seq::text
        || ',"session":' || to_json(e.session)::text || ',"time":' || to_json(e.time)::text
        || ',"type":' || to_json(e.type)::text || '}', 'UTF8')
$fn$;

-- Where a store stands: (0, genesis) when registered and empty, no row when unknown.
-- key_sha256 lets a shipper confirm the registered key is its own without reading it.
CREATE OR REPLACE FUNCTION hermes_archive.head(p_store_id text)
RETURNS TABLE (seq bigint, chain text, genesis text, key_sha256 text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
    SELECT coalesce(h.seq, 0), coalesce(h.chain, s.genesis), s.genesis,
           encode(sha256(convert_to(s.payload_key, 'UTF8')), 'hex')
      FROM hermes_archive.stores s
      LEFT JOIN LATERAL (
          SELECT e.seq, e.chain FROM hermes_archive.events e
           WHERE e.store_id = s.store_id ORDER BY e.seq DESC LIMIT 1) h ON true
     WHERE s.store_id = p_store_id
$fn$;

DROP TRIGGER IF EXISTS events_insert ON hermes_archive.events;
CREATE TRIGGER events_insert BEFORE INSERT ON hermes_archive.events
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.events_before_insert();
DROP TRIGGER IF EXISTS stores_insert ON hermes_archive.stores;
CREATE TRIGGER stores_insert BEFORE INSERT ON hermes_archive.stores
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.stores_before_insert();
DROP TRIGGER IF EXISTS payloads_insert ON hermes_archive.payloads;
CREATE TRIGGER payloads_insert BEFORE INSERT ON hermes_archive.payloads
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.payloads_before_insert();
DROP TRIGGER IF EXISTS payloads_update ON hermes_archive.payloads;
CREATE TRIGGER payloads_update BEFORE UPDATE ON hermes_archive.payloads
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.payloads_before_update();
DROP TRIGGER IF EXISTS events_update ON hermes_archive.events;
CREATE TRIGGER events_update BEFORE UPDATE OR DELETE ON hermes_archive.events
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.refuse_change();
DROP TRIGGER IF EXISTS payloads_delete ON hermes_archive.payloads;
CREATE TRIGGER payloads_delete BEFORE DELETE ON hermes_archive.payloads
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.refuse_change();
DROP TRIGGER IF EXISTS stores_update ON hermes_archive.stores;
CREATE TRIGGER stores_update BEFORE UPDATE OR DELETE ON hermes_archive.stores
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.refuse_change();
DROP TRIGGER IF EXISTS events_truncate ON hermes_archive.events;
CREATE TRIGGER events_truncate BEFORE TRUNCATE ON hermes_archive.events
    FOR EACH STATEMENT EXECUTE FUNCTION hermes_archive.refuse_change();
DROP TRIGGER IF EXISTS payloads_truncate ON hermes_archive.payloads;
CREATE TRIGGER payloads_truncate BEFORE TRUNCATE ON hermes_archive.payloads
    FOR EACH STATEMENT EXECUTE FUNCTION hermes_archive.refuse_change();
DROP TRIGGER IF EXISTS stores_truncate ON hermes_archive.stores;
CREATE TRIGGER stores_truncate BEFORE TRUNCATE ON hermes_archive.stores
    FOR EACH STATEMENT EXECUTE FUNCTION hermes_archive.refuse_change();

-- Grants: shippers insert (and learn only their head); readers read; erasers erase.
REVOKE ALL ON ALL TABLES IN SCHEMA hermes_archive FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA hermes_archive FROM PUBLIC;
GRANT INSERT ON hermes_archive.stores, hermes_archive.events, hermes_archive.payloads
    TO hermes_archive_shipper;
GRANT EXECUTE ON FUNCTION hermes_archive.head(text)
    TO hermes_archive_shipper, hermes_archive_reader;
GRANT EXECUTE ON FUNCTION hermes_archive.may_ship(text) TO hermes_archive_shipper;
GRANT EXECUTE ON FUNCTION hermes_archive.envelope(hermes_archive.events)
    TO hermes_archive_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA hermes_archive TO hermes_archive_reader;
GRANT EXECUTE ON FUNCTION hermes_archive.erase(text, bigint) TO hermes_archive_eraser;
