-- +goose Up
CREATE TABLE vendors (
    id             text PRIMARY KEY,
    name           text NOT NULL,
    -- what the vendor has been paid through claimflow, in cents; credited in
    -- the same transaction as each payouts row
    balance_cents  bigint NOT NULL DEFAULT 0 CHECK (balance_cents >= 0),
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE coupon_types (
    id            text PRIMARY KEY,
    vendor_id     text NOT NULL REFERENCES vendors (id),
    name          text NOT NULL,
    stock         integer NOT NULL CHECK (stock >= 0),
    -- issued counts coupons not revoked; the CHECK is the last line of
    -- defence against issuing beyond the stock.
    issued        integer NOT NULL DEFAULT 0 CHECK (issued >= 0 AND issued <= stock),
    payout_cents  bigint NOT NULL CHECK (payout_cents > 0),
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX coupon_types_vendor ON coupon_types (vendor_id);

CREATE TABLE coupons (
    id               text PRIMARY KEY,
    type_id          text NOT NULL REFERENCES coupon_types (id),
    user_id          text NOT NULL,
    status           text NOT NULL CHECK (status IN ('issued', 'using', 'used', 'revoked')),
    -- the use attempt holding (using) or having used (used) the coupon
    use_id           text,
    order_id         text,
    workflow_id      text NOT NULL,  -- the IssueCoupon run
    run_id           text NOT NULL,
    use_workflow_id  text,           -- the UseCoupon run of use_id
    use_run_id       text,
    requested_at     timestamptz NOT NULL,
    issued_at        timestamptz NOT NULL,
    using_at         timestamptz,
    used_at          timestamptz,
    revoked_at       timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((status IN ('using', 'used')) = (use_id IS NOT NULL))
);

-- One coupon per user and type, whatever the concurrency; a revoked coupon
-- no longer counts.
CREATE UNIQUE INDEX coupons_one_per_user
    ON coupons (type_id, user_id)
    WHERE status <> 'revoked';

CREATE INDEX coupons_type ON coupons (type_id, status);

-- The ledger: one row per paid use, keyed by the idempotency key sent to the
-- vendor's payout API, and at most one paid use per coupon.
CREATE TABLE payouts (
    id                  bigserial PRIMARY KEY,
    idempotency_key     text NOT NULL UNIQUE,
    coupon_id           text NOT NULL UNIQUE REFERENCES coupons (id),
    use_id              text NOT NULL,
    vendor_id           text NOT NULL REFERENCES vendors (id),
    amount_cents        bigint NOT NULL CHECK (amount_cents > 0),
    provider_payout_id  text NOT NULL,
    order_id            text,
    workflow_id         text NOT NULL,
    run_id              text NOT NULL,
    recorded_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX payouts_vendor ON payouts (vendor_id, id);

-- Dead letters of coupon events name their coupon; the column is derived
-- from the event, so RecordDeadLetter stays the same for every saga.
ALTER TABLE dead_letters
    ADD COLUMN coupon_id text GENERATED ALWAYS AS (payload -> 'data' ->> 'coupon_id') STORED;

CREATE INDEX dead_letters_coupon ON dead_letters (coupon_id) WHERE coupon_id IS NOT NULL;

-- +goose Down
DROP INDEX dead_letters_coupon;
ALTER TABLE dead_letters DROP COLUMN coupon_id;
DROP TABLE payouts;
DROP TABLE coupons;
DROP TABLE coupon_types;
DROP TABLE vendors;
