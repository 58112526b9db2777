-- hermes-archive central store: many format 2 archives, keyed by (store_id, seq).
--
-- Run by `hermes-archive central init --db URL` as a superuser (or a role that may create
-- roles and is a member of hermes_archive_owner). Idempotent: running it again changes
-- nothing that exists. A database made by an earlier schema that also took format 1 is
-- brought to this one, or refused with the reason when it holds a format 1 store.
-- docs/OPERATIONS.md "Fleet" explains the roles.
--
-- PostgreSQL enforces what it can compute itself: gap-free seq per store, each row's
-- prev_chain equal to the stored chain of the row before, every digest an event names
-- present in payloads, no UPDATE / DELETE / TRUNCATE, and erasure only of payloads an
-- already-shipped erasure event lists. It also recomputes the SHA-256 Merkle tree
-- (RFC 6962 leaves over the envelope bytes it builds itself, docs/FORMAT.md 14) and
-- refuses a signed checkpoint whose root is not the root it computed at that size. It has
-- no BLAKE3 and no Ed25519: digests, chain values and signatures are checked by the shipper
-- before sending and by `hermes-archive --db URL verify`, which runs the package's verifier
-- over these rows.

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
    -- registers each store (id, genesis, key) to the shipping login that may ship it, and
    -- releases legal holds centrally: nothing a shipper may do
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'hermes_archive_admin') THEN
        CREATE ROLE hermes_archive_admin NOLOGIN;
    END IF;
END
$roles$;

CREATE SCHEMA IF NOT EXISTS hermes_archive AUTHORIZATION hermes_archive_owner;
REVOKE ALL ON SCHEMA hermes_archive FROM PUBLIC;
GRANT USAGE ON SCHEMA hermes_archive
    TO hermes_archive_shipper, hermes_archive_reader, hermes_archive_eraser, hermes_archive_admin;

SET LOCAL ROLE hermes_archive_owner;
SET LOCAL search_path = pg_catalog, hermes_archive;

CREATE TABLE IF NOT EXISTS hermes_archive.stores (
    store_id       text PRIMARY KEY CHECK (store_id ~ '^[0-9a-f]{32}$'),
    -- the archive format of the store's rows: 2 only (a later format widens this CHECK)
    format_version integer NOT NULL CONSTRAINT stores_format_version_check
                   CHECK (format_version = 2),
    genesis        text NOT NULL CHECK (genesis ~ '^[0-9a-f]{64}$'),
    -- the verifier key the store was registered with (meta.vkey); its store.key, a lookup
    -- key, is never shipped (each payload's salt is)
    vkey           text NOT NULL,
    label          text NOT NULL DEFAULT '',
    -- the login role that may append to this store (or a role it is granted to), named
    -- by the administrator who registered it
    shipper        name NOT NULL,
    registered     timestamptz NOT NULL DEFAULT now(),
    -- the administrator's login role; set by the server, whatever the client sends
    registered_by  name NOT NULL DEFAULT session_user
);

-- a store table made before stores were registered by an administrator
ALTER TABLE hermes_archive.stores ALTER COLUMN shipper DROP DEFAULT;
ALTER TABLE hermes_archive.stores
    ADD COLUMN IF NOT EXISTS registered_by name NOT NULL DEFAULT session_user;

-- A store table made when the central store also took format 1 (a payload_key column):
-- refused while it holds a format 1 store, which nothing here reads any more; else brought
-- to format 2 only, with the functions that took a format argument dropped.
DO $format_2$
DECLARE
    old_store text;
    old_check text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = 'hermes_archive.stores'::regclass
                      AND attname = 'payload_key' AND NOT attisdropped) THEN
        RETURN;
    END IF;
    SELECT s.store_id INTO old_store FROM hermes_archive.stores s
     WHERE s.format_version <> 2 ORDER BY s.store_id LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'this central database holds format 1 store % (and maybe others): '
            'hermes-archive keeps only format 2 archives centrally', old_store
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'migrate each local archive (hermes-archive migrate) and ship it to a '
                         'new central database; this one is left unchanged';
    END IF;
    FOR old_check IN
        SELECT c.conname FROM pg_constraint c
         WHERE c.conrelid = 'hermes_archive.stores'::regclass AND c.contype = 'c'
           AND pg_get_constraintdef(c.oid) ~ 'format_version|vkey'
    LOOP
        EXECUTE format('ALTER TABLE hermes_archive.stores DROP CONSTRAINT %I', old_check);
    END LOOP;
    ALTER TABLE hermes_archive.stores DROP COLUMN payload_key,
        ALTER COLUMN vkey SET NOT NULL,
        ADD CONSTRAINT stores_format_version_check CHECK (format_version = 2);
    DROP FUNCTION IF EXISTS hermes_archive.envelope_bytes(
        integer, bigint, text, text, text, text, text, text, text, text);
    DROP FUNCTION IF EXISTS hermes_archive.format_of(text);
END
$format_2$;

-- Legal holds released centrally: a shipped `legal_hold_released` event is the host's word,
-- which the server cannot authenticate, so a hold keeps its data here until an
-- administrator records its release (`hermes-archive central release-hold`).
CREATE TABLE IF NOT EXISTS hermes_archive.hold_releases (
    store_id    text NOT NULL REFERENCES hermes_archive.stores,
    hold        text NOT NULL,
    reason      text NOT NULL CHECK (reason <> ''),
    released_by name NOT NULL DEFAULT session_user,
    released    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (store_id, hold)
);

CREATE TABLE IF NOT EXISTS hermes_archive.payloads (
    store_id  text NOT NULL REFERENCES hermes_archive.stores,
    digest    text NOT NULL CHECK (digest ~ '^[0-9a-f]{64}$'),
    body      bytea,                 -- NULL once erased
    salt      bytea,                 -- the payload's random salt; NULL once erased
    erased_by bigint,                -- seq of the erasure event that covered it
    search    tsvector,              -- set by the insert trigger, for full-text search
    PRIMARY KEY (store_id, digest),
    CHECK ((body IS NULL) = (erased_by IS NOT NULL)),
    CHECK (salt IS NULL OR (body IS NOT NULL AND length(salt) = 32))
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
    author     text CHECK (author ~ '^[0-9a-f]{64}$'),  -- the author payload, if any
    prev_chain text NOT NULL CHECK (prev_chain ~ '^[0-9a-f]{64}$'),
    chain      text NOT NULL CHECK (chain ~ '^[0-9a-f]{64}$'),
    shipped    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (store_id, seq),
    UNIQUE (identity, store_id),
    FOREIGN KEY (store_id, payload) REFERENCES hermes_archive.payloads (store_id, digest),
    FOREIGN KEY (store_id, author) REFERENCES hermes_archive.payloads (store_id, digest)
);
-- Only the primary key starts with store_id: the insert trigger's lookup of (store_id,
-- seq - 1) runs while a batch's rows are not in the planner's statistics, and an index that
-- also starts with store_id would be scanned for the whole store instead.
CREATE INDEX IF NOT EXISTS events_session ON hermes_archive.events (session, store_id, seq);
CREATE INDEX IF NOT EXISTS events_type ON hermes_archive.events (type, store_id, seq);
CREATE INDEX IF NOT EXISTS events_time ON hermes_archive.events (time);
CREATE INDEX IF NOT EXISTS events_payload ON hermes_archive.events (payload, store_id);
CREATE INDEX IF NOT EXISTS events_parts ON hermes_archive.events USING gin ((parts::jsonb));

CREATE INDEX IF NOT EXISTS payloads_erased_by ON hermes_archive.payloads (store_id, erased_by)
    WHERE erased_by IS NOT NULL;

-- docs/FORMAT.md 12.4: every digest a shipped erasure event lists, and that
-- event's seq. Filled only by erase(), from the erasure event's own body.
CREATE TABLE IF NOT EXISTS hermes_archive.erased (
    store_id    text NOT NULL REFERENCES hermes_archive.stores,
    digest      text NOT NULL CHECK (digest ~ '^[0-9a-f]{64}$'),
    erasure_seq bigint NOT NULL,
    PRIMARY KEY (store_id, digest),
    FOREIGN KEY (store_id, erasure_seq) REFERENCES hermes_archive.events (store_id, seq)
);

-- The server's own Merkle tree per store (RFC 6962, SHA-256): the compact range
-- (one perfect-subtree hash per set bit of size, left to right) and the root at size,
-- grown by the events statement trigger from the envelope bytes the server builds.
CREATE TABLE IF NOT EXISTS hermes_archive.trees (
    store_id text PRIMARY KEY REFERENCES hermes_archive.stores,
    size     bigint NOT NULL CHECK (size >= 0),
    range    bytea[] NOT NULL,
    root     bytea NOT NULL CHECK (length(root) = 32)
);

-- Signed checkpoints and cosignatures (docs/FORMAT.md 15.5), per store. The
-- server accepts a checkpoint only at the size its own tree has reached, with its root.
CREATE TABLE IF NOT EXISTS hermes_archive.checkpoints (
    store_id  text NOT NULL REFERENCES hermes_archive.stores,
    size      bigint NOT NULL CHECK (size >= 0),
    root      bytea NOT NULL CHECK (length(root) = 32),
    time      text NOT NULL,
    signature bytea NOT NULL CHECK (length(signature) = 64),
    shipped   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (store_id, size)
);
CREATE TABLE IF NOT EXISTS hermes_archive.cosignatures (
    store_id  text NOT NULL,
    size      bigint NOT NULL,
    name      text NOT NULL,
    key_id    bytea NOT NULL CHECK (length(key_id) = 4),
    timestamp bigint NOT NULL,
    signature bytea NOT NULL CHECK (length(signature) = 64),
    PRIMARY KEY (store_id, size, name, key_id),
    FOREIGN KEY (store_id, size) REFERENCES hermes_archive.checkpoints (store_id, size)
);

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
    IF NOT pg_has_role(session_user, 'hermes_archive_admin', 'MEMBER') THEN
        RAISE EXCEPTION 'store %: only hermes_archive_admin registers stores (% may not)',
            NEW.store_id, session_user USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = NEW.shipper) THEN
        RAISE EXCEPTION 'store %: the shipping role % does not exist', NEW.store_id, NEW.shipper
            USING ERRCODE = 'undefined_object';
    END IF;
    NEW.registered_by := session_user;
    NEW.registered := now();
    RETURN NEW;
END
$fn$;

CREATE OR REPLACE FUNCTION hermes_archive.hold_releases_before_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
BEGIN
    IF NOT pg_has_role(session_user, 'hermes_archive_admin', 'MEMBER') THEN
        RAISE EXCEPTION 'store %: only hermes_archive_admin releases a legal hold centrally',
            NEW.store_id USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM 1 FROM hermes_archive.events e
      JOIN hermes_archive.payloads p ON p.store_id = e.store_id AND p.digest = e.payload
     WHERE e.store_id = NEW.store_id AND e.type = 'legal_hold' AND p.body IS NOT NULL
       AND convert_from(p.body, 'UTF8')::jsonb ->> 'hold' = NEW.hold;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'store %: no shipped legal hold %', NEW.store_id, NEW.hold
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.released_by := session_user;
    NEW.released := now();
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
    -- the parts list as the canonical encoding writes it: the server splices it verbatim
    -- into the envelope bytes it hashes, so no other spelling is accepted
    IF NEW.parts !~ '^\[("[0-9a-f]{64}"(,"[0-9a-f]{64}")*)?\]$' THEN
        RAISE EXCEPTION 'store %: seq %: parts is not a canonical list of digests',
            NEW.store_id, NEW.seq USING ERRCODE = 'check_violation';
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
    -- a payload that arrived already erased names this seq as its erasure: it must be one
    IF NEW.type <> 'erasure' AND EXISTS (
        SELECT 1 FROM hermes_archive.payloads p
         WHERE p.store_id = NEW.store_id AND p.erased_by = NEW.seq) THEN
        RAISE EXCEPTION 'store %: seq % is not an erasure, yet payloads arrived erased by it',
            NEW.store_id, NEW.seq USING ERRCODE = 'check_violation';
    END IF;
    NEW.shipped := now();
    RETURN NEW;
END
$fn$;

-- The envelope bytes of a row (docs/FORMAT.md 13.1), built by the server itself.
-- to_json(text) writes exactly the canonical text of 2.3 for every string PostgreSQL can
-- hold; key and parts are canonical (the shipper's verify and, for parts, the insert trigger
-- hold them to it).
CREATE OR REPLACE FUNCTION hermes_archive.envelope_bytes(
    p_seq bigint, p_time text, p_type text, p_session text, p_key text, p_identity text,
    p_payload text, p_parts text, p_author text
) RETURNS bytea
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog AS $fn$
    SELECT convert_to(
        '{"author":' || coalesce('"' || p_author || '"', 'null')
        || ',"identity":"' || p_identity || '","key":' || p_key || ',"parts":' || p_parts
        || ',"payload":"' || p_payload || '","seq":' || p_seq::text
        || ',"session":' || to_json(p_session)::text || ',"time":' || to_json(p_time)::text
        || ',"type":' || to_json(p_type)::text || '}', 'UTF8')
$fn$;

CREATE OR REPLACE FUNCTION hermes_archive.envelope(e hermes_archive.events) RETURNS bytea
LANGUAGE sql STABLE SET search_path = pg_catalog AS $fn$
    SELECT hermes_archive.envelope_bytes(
        e.seq, e.time, e.type, e.session, e.key, e.identity, e.payload, e.parts, e.author)
$fn$;

-- The root of a compact range (RFC 6962: fold the perfect subtrees from the right).
CREATE OR REPLACE FUNCTION hermes_archive.range_root(p_range bytea[]) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog AS $fn$
DECLARE
    n    integer := coalesce(array_length(p_range, 1), 0);
    root bytea;
BEGIN
    IF n = 0 THEN
        RETURN sha256(''::bytea);
    END IF;
    root := p_range[n];
    FOR i IN REVERSE n - 1 .. 1 LOOP
        root := sha256('\x01'::bytea || p_range[i] || root);
    END LOOP;
    RETURN root;
END
$fn$;

-- After each INSERT statement on events, hash the new rows' envelopes into their
-- stores' trees (leaf = SHA-256(0x00 || envelope), node = SHA-256(0x01 || left || right)).
CREATE OR REPLACE FUNCTION hermes_archive.events_grow_tree() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
DECLARE
    r        record;
    current  text := NULL;
    t_size   bigint;
    t_range  bytea[];
    m        bigint;
    n        integer;
BEGIN
    FOR r IN
        SELECT w.store_id, w.seq,
               sha256('\x00'::bytea || hermes_archive.envelope_bytes(w.seq, w.time, w.type,
                   w.session, w.key, w.identity, w.payload, w.parts, w.author)) AS leaf
          FROM new_rows w
         ORDER BY w.store_id, w.seq
    LOOP
        IF current IS DISTINCT FROM r.store_id THEN
            IF current IS NOT NULL THEN
                PERFORM hermes_archive.save_tree(current, t_size, t_range);
            END IF;
            current := r.store_id;
            SELECT t.size, t.range INTO t_size, t_range FROM hermes_archive.trees t
             WHERE t.store_id = r.store_id FOR UPDATE;
            IF NOT FOUND THEN
                t_size := 0;
                t_range := '{}';
            END IF;
        END IF;
        IF r.seq <> t_size + 1 THEN
            RAISE EXCEPTION 'store %: seq % does not extend the tree of % events',
                r.store_id, r.seq, t_size USING ERRCODE = 'check_violation';
        END IF;
        t_range := t_range || r.leaf;
        m := t_size;
        WHILE m % 2 = 1 LOOP
            n := array_length(t_range, 1);
            t_range := t_range[1 : n - 2]
                || sha256('\x01'::bytea || t_range[n - 1] || t_range[n]);
            m := m / 2;
        END LOOP;
        t_size := t_size + 1;
    END LOOP;
    IF current IS NOT NULL THEN
        PERFORM hermes_archive.save_tree(current, t_size, t_range);
    END IF;
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION hermes_archive.save_tree(
    p_store_id text, p_size bigint, p_range bytea[]
) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
    INSERT INTO hermes_archive.trees AS t (store_id, size, range, root)
    VALUES (p_store_id, p_size, p_range, hermes_archive.range_root(p_range))
    ON CONFLICT (store_id) DO UPDATE
       SET size = excluded.size, range = excluded.range, root = excluded.root
$fn$;

-- A tree only grows (the statement trigger is its one writer).
CREATE OR REPLACE FUNCTION hermes_archive.trees_before_update() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $fn$
BEGIN
    IF NEW.store_id = OLD.store_id AND NEW.size > OLD.size THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'a store''s tree only grows' USING ERRCODE = 'insufficient_privilege';
END
$fn$;

-- A signed checkpoint is accepted only at the size the server's tree has now, with the root
-- the server computed; the same checkpoint sent again is skipped (idempotent shipping).
CREATE OR REPLACE FUNCTION hermes_archive.checkpoints_before_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
DECLARE
    t_size bigint;
    t_root bytea;
    old    hermes_archive.checkpoints;
BEGIN
    IF NOT hermes_archive.may_ship(NEW.store_id) THEN
        RAISE EXCEPTION 'store %: % did not register it and may not add checkpoints to it',
            NEW.store_id, session_user USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT * INTO old FROM hermes_archive.checkpoints c
     WHERE c.store_id = NEW.store_id AND c.size = NEW.size;
    IF FOUND THEN
        IF old.root = NEW.root AND old.signature = NEW.signature THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'store %: a different checkpoint at size % was shipped before',
            NEW.store_id, NEW.size USING ERRCODE = 'check_violation';
    END IF;
    SELECT t.size, t.root INTO t_size, t_root FROM hermes_archive.trees t
     WHERE t.store_id = NEW.store_id FOR SHARE;
    IF NOT FOUND THEN
        t_size := 0;
        t_root := sha256(''::bytea);
    END IF;
    IF NEW.size <> t_size THEN
        RAISE EXCEPTION 'store %: a checkpoint at size % arrived when the central tree holds % '
            'events (a checkpoint is shipped right after the events it covers)',
            NEW.store_id, NEW.size, t_size USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.root <> t_root THEN
        RAISE EXCEPTION 'store %: the signed checkpoint at size % names a root that is not the '
            'root of the shipped events', NEW.store_id, NEW.size
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.shipped := now();
    RETURN NEW;
END
$fn$;

CREATE OR REPLACE FUNCTION hermes_archive.cosignatures_before_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
BEGIN
    IF NOT hermes_archive.may_ship(NEW.store_id) THEN
        RAISE EXCEPTION 'store %: % did not register it and may not add cosignatures to it',
            NEW.store_id, session_user USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$fn$;

-- A payload arrives whole, with its salt; its search vector is computed here, never sent.
-- A payload that was erased before it was shipped arrives as a tombstone (no body, no salt)
-- naming its erasure, which must arrive in the same transaction (checked at commit).
CREATE OR REPLACE FUNCTION hermes_archive.payloads_before_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
BEGIN
    IF NOT hermes_archive.may_ship(NEW.store_id) THEN
        RAISE EXCEPTION 'store %: % did not register it and may not add payloads to it',
            NEW.store_id, session_user USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.body IS NULL THEN
        IF NEW.erased_by IS NOT NULL AND NEW.salt IS NULL THEN
            NEW.search := NULL;
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'store %: payload % arrives without its body', NEW.store_id, NEW.digest
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.erased_by IS NOT NULL OR NEW.salt IS NULL THEN
        RAISE EXCEPTION 'store %: payload % arrives without its salt, or marked erased',
            NEW.store_id, NEW.digest USING ERRCODE = 'check_violation';
    END IF;
    NEW.search := to_tsvector('english', left(convert_from(NEW.body, 'UTF8'), 100000));
    RETURN NEW;
END
$fn$;

-- At commit: a payload that arrived erased is listed by the erasure event it names.
CREATE OR REPLACE FUNCTION hermes_archive.tombstone_covered() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
BEGIN
    PERFORM 1 FROM hermes_archive.erased x
     WHERE x.store_id = NEW.store_id AND x.digest = NEW.digest
       AND x.erasure_seq = NEW.erased_by;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'store %: payload % arrived erased, but no shipped erasure event at '
            'seq % lists it', NEW.store_id, NEW.digest, NEW.erased_by
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END
$fn$;

-- The only change a payload row ever takes: body and salt blanked under a shipped erasure
-- event that lists it (erase() records that in `erased` first).
CREATE OR REPLACE FUNCTION hermes_archive.payloads_before_update() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, hermes_archive AS $fn$
BEGIN
    IF OLD.body IS NOT NULL AND NEW.body IS NULL AND NEW.salt IS NULL
       AND NEW.store_id = OLD.store_id AND NEW.digest = OLD.digest
       AND EXISTS (SELECT 1 FROM hermes_archive.erased x
                    WHERE x.store_id = NEW.store_id AND x.digest = NEW.digest
                      AND x.erasure_seq = NEW.erased_by) THEN
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

-- The legal hold in force before seq p_before (a `legal_hold` event not released by an
-- administrator in hold_releases: a shipped `legal_hold_released` does not count) that
-- covers an event naming one of p_digests, if any: the same selectors as
-- `hermes-archive hold add` (session, time range, author id).
CREATE OR REPLACE FUNCTION hermes_archive.holding(
    p_store_id text, p_before bigint, p_digests text[]
) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
DECLARE
    h   record;
    sel jsonb;
BEGIN
    FOR h IN
        SELECT b.seq, b.body ->> 'hold' AS hold, b.body -> 'selector' AS selector
          FROM (SELECT e.seq, convert_from(p.body, 'UTF8')::jsonb AS body
                  FROM hermes_archive.events e
                  JOIN hermes_archive.payloads p
                    ON p.store_id = e.store_id AND p.digest = e.payload
                 WHERE e.store_id = p_store_id AND e.type = 'legal_hold' AND e.seq < p_before
                   AND p.body IS NOT NULL) b
         WHERE NOT EXISTS (
             SELECT 1 FROM hermes_archive.hold_releases r
              WHERE r.store_id = p_store_id AND r.hold = b.body ->> 'hold')
    LOOP
        sel := h.selector;
        PERFORM 1 FROM hermes_archive.events ev
          LEFT JOIN hermes_archive.payloads a
            ON a.store_id = ev.store_id AND a.digest = ev.author
         WHERE ev.store_id = p_store_id AND ev.seq < p_before
           AND (ev.payload = ANY (p_digests) OR ev.author = ANY (p_digests)
                OR ev.parts::jsonb ?| p_digests)
           AND ((sel ? 'session' AND ev.session = sel ->> 'session')
                OR (sel ? 'since' AND ev.time >= sel ->> 'since' AND ev.time < sel ->> 'until')
                OR (sel ? 'author' AND a.body IS NOT NULL
                    AND convert_from(a.body, 'UTF8')::jsonb ->> 'id' = sel ->> 'author'))
         LIMIT 1;
        IF FOUND THEN
            RETURN h.hold;
        END IF;
    END LOOP;
    RETURN NULL;
END
$fn$;

-- Apply the (already shipped) erasure event at (store, seq): record every digest its body
-- lists (docs/FORMAT.md 18: "digests") and blank the body, salt and search vector of each
-- such payload the server holds. Runs by itself when the event is shipped; idempotent.
-- An erasure that reaches data under a legal hold in force is refused (and so is the
-- erasure event: the local archive refuses such an erasure too, so only a forged or
-- damaged log ships one).
CREATE OR REPLACE FUNCTION hermes_archive.erase(p_store_id text, p_erasure_seq bigint)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
DECLARE
    own     text;
    listing jsonb;
    digests text[];
    held    text;
    blanked integer;
BEGIN
    SELECT e.payload, convert_from(p.body, 'UTF8')::jsonb -> 'digests' INTO own, listing
      FROM hermes_archive.events e
      JOIN hermes_archive.payloads p ON p.store_id = e.store_id AND p.digest = e.payload
     WHERE e.store_id = p_store_id AND e.seq = p_erasure_seq AND e.type = 'erasure'
       AND p.body IS NOT NULL;
    IF NOT FOUND OR jsonb_typeof(listing) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'store %: seq % is not a shipped erasure event listing digests',
            p_store_id, p_erasure_seq USING ERRCODE = 'check_violation';
    END IF;
    SELECT coalesce(array_agg(d), '{}') INTO digests
      FROM jsonb_array_elements_text(listing) d WHERE d ~ '^[0-9a-f]{64}$' AND d <> own;
    held := hermes_archive.holding(p_store_id, p_erasure_seq, digests);
    IF held IS NOT NULL THEN
        RAISE EXCEPTION 'store %: the erasure at seq % reaches data under legal hold %',
            p_store_id, p_erasure_seq, held USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO hermes_archive.erased (store_id, digest, erasure_seq)
    SELECT p_store_id, d, p_erasure_seq FROM unnest(digests) d
    ON CONFLICT DO NOTHING;
    UPDATE hermes_archive.payloads p SET body = NULL, salt = NULL, erased_by = x.erasure_seq
      FROM hermes_archive.erased x
     WHERE x.store_id = p_store_id AND x.erasure_seq = p_erasure_seq
       AND p.store_id = x.store_id AND p.digest = x.digest AND p.body IS NOT NULL;
    GET DIAGNOSTICS blanked = ROW_COUNT;
    RETURN blanked;
END
$fn$;

CREATE OR REPLACE FUNCTION hermes_archive.events_after_erasure() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
BEGIN
    PERFORM hermes_archive.erase(NEW.store_id, NEW.seq);
    RETURN NULL;
END
$fn$;

-- Where a store stands: (0, genesis) when registered and empty, no row when unknown or
-- when the caller may not see it (a shipper sees only the stores registered to it).
-- key_sha256 (of the registered verifier key) lets a shipper confirm the registered store
-- is its own without reading the key; checkpoint is the largest shipped checkpoint size
-- (-1: none), cosignatures how many were shipped.
DROP FUNCTION IF EXISTS hermes_archive.head(text);
CREATE OR REPLACE FUNCTION hermes_archive.head(p_store_id text)
RETURNS TABLE (seq bigint, chain text, genesis text, key_sha256 text, checkpoint bigint,
               cosignatures bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
    SELECT coalesce(h.seq, 0), coalesce(h.chain, s.genesis), s.genesis,
           encode(sha256(convert_to(s.vkey, 'UTF8')), 'hex'),
           (SELECT coalesce(max(c.size), -1) FROM hermes_archive.checkpoints c
             WHERE c.store_id = s.store_id),
           (SELECT count(*) FROM hermes_archive.cosignatures c WHERE c.store_id = s.store_id)
      FROM hermes_archive.stores s
      LEFT JOIN LATERAL (
          SELECT e.seq, e.chain FROM hermes_archive.events e
           WHERE e.store_id = s.store_id ORDER BY e.seq DESC LIMIT 1) h ON true
     WHERE s.store_id = p_store_id
       AND (hermes_archive.may_ship(s.store_id)
            OR pg_has_role(session_user, 'hermes_archive_reader', 'MEMBER')
            OR pg_has_role(session_user, 'hermes_archive_admin', 'MEMBER'))
$fn$;

-- The cosignatures a store has centrally (a shipper sends only the missing ones).
CREATE OR REPLACE FUNCTION hermes_archive.cosigned(p_store_id text)
RETURNS TABLE (size bigint, name text, key_id bytea)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, hermes_archive AS $fn$
    SELECT c.size, c.name, c.key_id FROM hermes_archive.cosignatures c
     WHERE c.store_id = p_store_id AND hermes_archive.may_ship(p_store_id)
$fn$;

DROP TRIGGER IF EXISTS events_insert ON hermes_archive.events;
CREATE TRIGGER events_insert BEFORE INSERT ON hermes_archive.events
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.events_before_insert();
DROP TRIGGER IF EXISTS events_tree ON hermes_archive.events;
CREATE TRIGGER events_tree AFTER INSERT ON hermes_archive.events
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION hermes_archive.events_grow_tree();
DROP TRIGGER IF EXISTS events_erasure ON hermes_archive.events;
CREATE TRIGGER events_erasure AFTER INSERT ON hermes_archive.events
    FOR EACH ROW WHEN (NEW.type = 'erasure')
    EXECUTE FUNCTION hermes_archive.events_after_erasure();
DROP TRIGGER IF EXISTS stores_insert ON hermes_archive.stores;
CREATE TRIGGER stores_insert BEFORE INSERT ON hermes_archive.stores
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.stores_before_insert();
DROP TRIGGER IF EXISTS hold_releases_insert ON hermes_archive.hold_releases;
CREATE TRIGGER hold_releases_insert BEFORE INSERT ON hermes_archive.hold_releases
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.hold_releases_before_insert();
DROP TRIGGER IF EXISTS hold_releases_update ON hermes_archive.hold_releases;
CREATE TRIGGER hold_releases_update BEFORE UPDATE OR DELETE ON hermes_archive.hold_releases
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.refuse_change();
DROP TRIGGER IF EXISTS payloads_insert ON hermes_archive.payloads;
CREATE TRIGGER payloads_insert BEFORE INSERT ON hermes_archive.payloads
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.payloads_before_insert();
DROP TRIGGER IF EXISTS payloads_tombstone ON hermes_archive.payloads;
CREATE CONSTRAINT TRIGGER payloads_tombstone AFTER INSERT ON hermes_archive.payloads
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.body IS NULL)
    EXECUTE FUNCTION hermes_archive.tombstone_covered();
DROP TRIGGER IF EXISTS payloads_update ON hermes_archive.payloads;
CREATE TRIGGER payloads_update BEFORE UPDATE ON hermes_archive.payloads
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.payloads_before_update();
DROP TRIGGER IF EXISTS checkpoints_insert ON hermes_archive.checkpoints;
CREATE TRIGGER checkpoints_insert BEFORE INSERT ON hermes_archive.checkpoints
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.checkpoints_before_insert();
DROP TRIGGER IF EXISTS cosignatures_insert ON hermes_archive.cosignatures;
CREATE TRIGGER cosignatures_insert BEFORE INSERT ON hermes_archive.cosignatures
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.cosignatures_before_insert();
DROP TRIGGER IF EXISTS trees_update ON hermes_archive.trees;
CREATE TRIGGER trees_update BEFORE UPDATE ON hermes_archive.trees
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.trees_before_update();
DROP TRIGGER IF EXISTS events_update ON hermes_archive.events;
CREATE TRIGGER events_update BEFORE UPDATE OR DELETE ON hermes_archive.events
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.refuse_change();
DROP TRIGGER IF EXISTS payloads_delete ON hermes_archive.payloads;
CREATE TRIGGER payloads_delete BEFORE DELETE ON hermes_archive.payloads
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.refuse_change();
DROP TRIGGER IF EXISTS stores_update ON hermes_archive.stores;
CREATE TRIGGER stores_update BEFORE UPDATE OR DELETE ON hermes_archive.stores
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.refuse_change();
DROP TRIGGER IF EXISTS erased_update ON hermes_archive.erased;
CREATE TRIGGER erased_update BEFORE UPDATE OR DELETE ON hermes_archive.erased
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.refuse_change();
DROP TRIGGER IF EXISTS trees_delete ON hermes_archive.trees;
CREATE TRIGGER trees_delete BEFORE DELETE ON hermes_archive.trees
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.refuse_change();
DROP TRIGGER IF EXISTS checkpoints_update ON hermes_archive.checkpoints;
CREATE TRIGGER checkpoints_update BEFORE UPDATE OR DELETE ON hermes_archive.checkpoints
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.refuse_change();
DROP TRIGGER IF EXISTS cosignatures_update ON hermes_archive.cosignatures;
CREATE TRIGGER cosignatures_update BEFORE UPDATE OR DELETE ON hermes_archive.cosignatures
    FOR EACH ROW EXECUTE FUNCTION hermes_archive.refuse_change();
DO $truncate$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['events', 'payloads', 'stores', 'erased', 'trees', 'checkpoints',
                             'cosignatures', 'hold_releases'] LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON hermes_archive.%I', t || '_truncate', t);
        EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON hermes_archive.%I '
                       'FOR EACH STATEMENT EXECUTE FUNCTION hermes_archive.refuse_change()',
                       t || '_truncate', t);
    END LOOP;
END
$truncate$;

-- Grants: administrators register stores and release holds; shippers insert into the
-- stores registered to them (and learn only their heads); readers read; erasers erase.
REVOKE ALL ON ALL TABLES IN SCHEMA hermes_archive FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA hermes_archive FROM PUBLIC;
REVOKE INSERT ON hermes_archive.stores FROM hermes_archive_shipper;  -- granted before 0.2
GRANT INSERT, SELECT ON hermes_archive.stores, hermes_archive.hold_releases
    TO hermes_archive_admin;
GRANT EXECUTE ON FUNCTION hermes_archive.head(text) TO hermes_archive_admin;
GRANT INSERT ON hermes_archive.events, hermes_archive.payloads,
    hermes_archive.checkpoints, hermes_archive.cosignatures
    TO hermes_archive_shipper;
GRANT EXECUTE ON FUNCTION hermes_archive.head(text)
    TO hermes_archive_shipper, hermes_archive_reader;
GRANT EXECUTE ON FUNCTION hermes_archive.cosigned(text) TO hermes_archive_shipper;
GRANT EXECUTE ON FUNCTION hermes_archive.may_ship(text) TO hermes_archive_shipper;
GRANT EXECUTE ON FUNCTION hermes_archive.envelope(hermes_archive.events),
    hermes_archive.envelope_bytes(bigint, text, text, text, text, text, text, text, text),
    hermes_archive.range_root(bytea[])
    TO hermes_archive_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA hermes_archive TO hermes_archive_reader;
GRANT EXECUTE ON FUNCTION hermes_archive.erase(text, bigint) TO hermes_archive_eraser;
