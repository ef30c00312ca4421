// Package pgstore keeps idempotency keys in PostgreSQL through
// jackc/pgx/v5: the store for a fleet of servers sharing one database.
//
// The handler writes its effect through Tx(r.Context()), the pgx.Tx the
// middleware began for it (READ COMMITTED, from the Store's pool); the
// recorded response commits in that same transaction. Leases and TTLs are
// measured on the database's clock, so the servers' clocks need not agree.
package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/resilienthttp/resilience/idempotency"
)

const schema = `CREATE TABLE IF NOT EXISTS idempotency_keys (
	principal   text        NOT NULL,
	operation   text        NOT NULL,
	key         text        NOT NULL,
	digest      bytea       NOT NULL,
	token       bytea,                      -- the owner's claim token; NULL once completed
	lease_until timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL,
	status      integer     NOT NULL DEFAULT 0, -- 0 while in progress
	header      bytea,
	body        bytea,
	PRIMARY KEY (principal, operation, key)
);
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON idempotency_keys (expires_at);`

// A Store is an idempotency.Store in PostgreSQL, in the table
// idempotency_keys of the pool's search path.
type Store struct {
	pool *pgxpool.Pool
}

// New creates the store's table if absent and returns the Store. Servers
// starting together may race on CREATE TABLE IF NOT EXISTS; create the table
// with a migration (the statement is in Schema) when that matters.
func New(ctx context.Context, pool *pgxpool.Pool) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgstore: nil *pgxpool.Pool")
	}
	if _, err := pool.Exec(ctx, schema); err != nil {
		return nil, fmt.Errorf("pgstore: create table idempotency_keys: %w", err)
	}
	return &Store{pool: pool}, nil
}

// Schema is the SQL that creates the store's table and index, for a
// migration tool.
func Schema() string { return schema }

type ctxKey struct{}

// Tx returns the transaction the middleware began for the request whose
// context is ctx, or nil outside an owned request. Write the handler's
// effect through it: it commits with the recorded response, or not at all.
// Do not commit or roll it back yourself.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(ctxKey{}).(pgx.Tx)
	return tx
}

const maxTries = 3

// Claim implements idempotency.Store: one round trip claims a free key; a
// taken one costs a second, to read it.
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Claim, error) {
	k := req.Key
	for range maxTries {
		tok := make([]byte, 16)
		_, _ = rand.Read(tok)
		tag, err := s.pool.Exec(ctx, `INSERT INTO idempotency_keys AS k
				(principal, operation, key, digest, token, lease_until, expires_at, status)
			VALUES ($1, $2, $3, $4, $5,
				clock_timestamp() + $6::bigint * interval '1 microsecond',
				clock_timestamp() + $7::bigint * interval '1 microsecond', 0)
			ON CONFLICT (principal, operation, key) DO UPDATE SET
				digest = excluded.digest, token = excluded.token, lease_until = excluded.lease_until,
				expires_at = excluded.expires_at, status = 0, header = NULL, body = NULL
			WHERE k.expires_at <= clock_timestamp()
				OR (k.status = 0 AND k.lease_until <= clock_timestamp() AND k.digest = excluded.digest)`,
			k.Principal, k.Operation, k.Key, req.Digest[:], tok,
			req.Lease.Microseconds(), req.TTL.Microseconds())
		if err != nil {
			return idempotency.Claim{}, fmt.Errorf("pgstore: claim key: %w", err)
		}
		if tag.RowsAffected() == 1 {
			// The transaction outlives the request's cancellation: the
			// middleware commits or aborts it.
			tx, err := s.pool.Begin(context.WithoutCancel(ctx))
			if err != nil {
				_ = s.release(context.WithoutCancel(ctx), k, tok)
				return idempotency.Claim{}, fmt.Errorf("pgstore: begin: %w", err)
			}
			return idempotency.Claim{State: idempotency.Owned, Txn: &txn{s: s, tx: tx, key: k, token: tok, ttl: req.TTL}}, nil
		}
		var (
			digest       []byte
			status       int
			leaseLeftSec float64
			header, body []byte
		)
		err = s.pool.QueryRow(ctx, `SELECT digest, status,
				extract(epoch FROM lease_until - clock_timestamp())::float8, header, body
			FROM idempotency_keys
			WHERE principal = $1 AND operation = $2 AND key = $3 AND expires_at > clock_timestamp()`,
			k.Principal, k.Operation, k.Key).Scan(&digest, &status, &leaseLeftSec, &header, &body)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // swept or released meanwhile: claim again
		}
		if err != nil {
			return idempotency.Claim{}, fmt.Errorf("pgstore: look up key: %w", err)
		}
		var d idempotency.Digest
		copy(d[:], digest)
		if status != 0 {
			resp := &idempotency.Response{Status: status, Body: body}
			if err := json.Unmarshal(header, &resp.Header); err != nil {
				return idempotency.Claim{}, fmt.Errorf("pgstore: decode recorded header: %w", err)
			}
			return idempotency.Claim{State: idempotency.Completed, Digest: d, Response: resp}, nil
		}
		left := time.Duration(leaseLeftSec * float64(time.Second))
		if left > 0 || d != req.Digest {
			return idempotency.Claim{State: idempotency.InProgress, Digest: d, LeaseLeft: max(left, 0)}, nil
		}
		// The lease expired between the insert and the lookup: claim again.
	}
	return idempotency.Claim{}, fmt.Errorf("pgstore: key kept changing during %d claims", maxTries)
}

func (s *Store) release(ctx context.Context, k idempotency.Key, token []byte) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM idempotency_keys
		WHERE principal = $1 AND operation = $2 AND key = $3 AND token = $4`,
		k.Principal, k.Operation, k.Key, token)
	return err
}

// Sweep implements idempotency.Store. Concurrent sweeps from several
// servers skip each other's rows rather than wait.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM idempotency_keys
		WHERE (principal, operation, key) IN (
			SELECT principal, operation, key FROM idempotency_keys
			WHERE expires_at <= clock_timestamp() LIMIT $1 FOR UPDATE SKIP LOCKED)`, limit)
	if err != nil {
		return 0, fmt.Errorf("pgstore: sweep: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

type txn struct {
	s     *Store
	tx    pgx.Tx
	key   idempotency.Key
	token []byte
	ttl   time.Duration
}

func (t *txn) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxKey{}, t.tx)
}

func (t *txn) Commit(ctx context.Context, resp *idempotency.Response) error {
	header := []byte("{}")
	if resp.Header != nil {
		var err error
		if header, err = json.Marshal(resp.Header); err != nil {
			_ = t.tx.Rollback(ctx)
			return fmt.Errorf("pgstore: encode header: %w", err)
		}
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	tag, err := t.tx.Exec(ctx, `UPDATE idempotency_keys
		SET status = $1, header = $2, body = $3, token = NULL, lease_until = clock_timestamp(),
			expires_at = clock_timestamp() + $4::bigint * interval '1 microsecond'
		WHERE principal = $5 AND operation = $6 AND key = $7 AND token = $8`,
		resp.Status, header, body, t.ttl.Microseconds(),
		t.key.Principal, t.key.Operation, t.key.Key, t.token)
	if err != nil {
		_ = t.tx.Rollback(ctx)
		return fmt.Errorf("pgstore: record response: %w", err)
	}
	if tag.RowsAffected() == 0 {
		_ = t.tx.Rollback(ctx)
		return idempotency.ErrClaimLost
	}
	if err := t.tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgstore: commit: %w", err)
	}
	return nil
}

func (t *txn) Abort(ctx context.Context) error {
	err := t.tx.Rollback(ctx)
	if errors.Is(err, pgx.ErrTxClosed) {
		err = nil
	}
	if rerr := t.s.release(ctx, t.key, t.token); rerr != nil {
		return fmt.Errorf("pgstore: release claim: %w", rerr)
	}
	return err
}
