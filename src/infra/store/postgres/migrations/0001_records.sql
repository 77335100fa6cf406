-- Version 1: the two tables every tree shares, so a new tree needs no
-- schema change (the tree's name is a column).

-- Records: values that live until deleted.
CREATE TABLE records (
    tree  text  NOT NULL,
    key   bytea NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (tree, key)
);

-- Expiring entries (replay checks, leases). `expires_at` is set by the
-- database's clock (`now()`), so replicas whose clocks differ agree.
CREATE TABLE expiring (
    tree       text        NOT NULL,
    key        bytea       NOT NULL,
    value      bytea       NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (tree, key)
);
CREATE INDEX expiring_by_expiry ON expiring (tree, expires_at);

-- Every change to a record tells the listening replicas which tree moved
-- (the payload is the tree's name, never a key or a value). Expiring
-- entries do not notify: nothing caches them, and the replay tree is
-- written once per proxied request.
CREATE FUNCTION records_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('credbroker_changes', COALESCE(NEW.tree, OLD.tree));
    RETURN NULL;
END;
$$;
CREATE TRIGGER records_changed
    AFTER INSERT OR UPDATE OR DELETE ON records
    FOR EACH ROW EXECUTE FUNCTION records_changed();
