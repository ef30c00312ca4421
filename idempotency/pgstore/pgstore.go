// Package pgstore keeps idempotency keys in PostgreSQL through
// jackc/pgx/v5: the store for a fleet of servers sharing one database.
//
// The handler writes its effect through Tx(r.Context()), the pgx.Tx the
// middleware began for it (READ COMMITTED, from the Store's pool); the
// recorded response commits in that same transaction. Leases and TTLs are
// measured on the database's clock, so the servers' clocks need not agree.
//
// The owner's transaction locks its key's row while it is open, so a live
// owner keeps its key past its lease (a claim meanwhile reports it in
// progress, without waiting), and its Commit lands. An owner that dies
// loses the key once PostgreSQL ends its transaction: at once when its
// process dies and its connection closes; when its host vanishes, only
// once the server notices the dead connection (tcp_keepalives_idle), or
// after idle_in_transaction_session_timeout if you set one.
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
	key_hash    bytea       PRIMARY KEY,    -- idempotency.Key.Hash: (principal, operation, key), fixed size
	digest      bytea       NOT NULL,
	token       bytea,                      -- the owner's claim token; NULL once completed
	lease_until timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL,
	status      integer     NOT NULL DEFAULT 0, -- 0 while in progress
	header      bytea,
	body        bytea
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
	if _, err := pool.Exec(ctx, `SELECT key_hash FROM idempotency_keys LIMIT 0`); err != nil {
		return nil, fmt.Errorf("pgstore: table idempotency_keys has an earlier layout (keys by principal, operation and key, not key_hash): rename it, and drop it once its keys' TTL has passed: %w", err)
	}
	return &Store{pool: pool}, nil
}

// Schema is the SQL that creates the store's table and index, for a
// migration tool.
func Schema() string { return schema }

type ctxKey struct{}

// Tx returns the transaction the middleware began for the request whose
// context is ctx, or nil outside an owned request: in particular for a
// write that carries no key, which goes to the handler unprotected unless
// Options.RequireKey is set (a client call made with
// resilience.WithRetryable(ctx, false) sends none). Check for nil before
// using it. Write the handler's effect through it: it commits with the
// recorded response, or not at all. Do not commit or roll it back
// yourself.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(ctxKey{}).(pgx.Tx)
	return tx
}

const maxTries = 3

// Claim implements idempotency.Store: one insert claims a free key, then
// the owner's transaction begins and locks the key's row (one round trip
// each); a taken key costs one read after the insert. The lock lasts as
// long as the owner's transaction, so a key whose lease expired is taken
// over only once that transaction has ended: the owner committed, aborted,
// or died (PostgreSQL ends the transaction of a connection that drops). A
// live owner is never taken over, whatever its lease: the claim skips its
// locked row, without waiting, and reports the key in progress. If the
// database goes away between the insert and the lock, the error comes
// with the claim's Txn, whose Abort releases the claim once the database
// answers again (idempotency.Store).
func (s *Store) Claim(ctx context.Context, req idempotency.ClaimRequest) (idempotency.Claim, error) {
	k := req.Key.Hash()
	ownerAlive := false
	for range maxTries {
		tok := make([]byte, 16)
		_, _ = rand.Read(tok)
		// ON CONFLICT DO NOTHING: a taken key's row may be locked by its
		// owner, and DO UPDATE would wait on that lock.
		tag, err := s.pool.Exec(ctx, `INSERT INTO idempotency_keys
				(key_hash, digest, token, lease_until, expires_at, status)
			VALUES ($1, $2, $3,
				clock_timestamp() + $4::bigint * interval '1 microsecond',
				clock_timestamp() + $5::bigint * interval '1 microsecond', 0)
			ON CONFLICT (key_hash) DO NOTHING`,
			k[:], req.Digest[:], tok,
			req.Lease.Microseconds(), req.TTL.Microseconds())
		if err != nil {
			return idempotency.Claim{}, fmt.Errorf("pgstore: claim key: %w", err)
		}
		if tag.RowsAffected() == 1 {
			c, ok, err := s.own(ctx, k, tok, req.TTL)
			if err != nil || ok {
				return c, err
			}
			continue // taken over between the insert and the lock: look again
		}
		var (
			digest       []byte
			status       int
			leaseLeftSec float64
			expired      bool
			header, body []byte
		)
		err = s.pool.QueryRow(ctx, `SELECT digest, status,
				extract(epoch FROM lease_until - clock_timestamp())::float8,
				expires_at <= clock_timestamp(), header, body
			FROM idempotency_keys WHERE key_hash = $1`,
			k[:]).Scan(&digest, &status, &leaseLeftSec, &expired, &header, &body)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // swept or released meanwhile: claim again
		}
		if err != nil {
			return idempotency.Claim{}, fmt.Errorf("pgstore: look up key: %w", err)
		}
		var d idempotency.Digest
		copy(d[:], digest)
		left := time.Duration(leaseLeftSec * float64(time.Second))
		if !expired {
			if status != 0 {
				resp := &idempotency.Response{Status: status, Body: body}
				if err := json.Unmarshal(header, &resp.Header); err != nil {
					return idempotency.Claim{}, fmt.Errorf("pgstore: decode recorded header: %w", err)
				}
				return idempotency.Claim{State: idempotency.Completed, Digest: d, Response: resp}, nil
			}
			if left > 0 || d != req.Digest {
				return idempotency.Claim{State: idempotency.InProgress, Digest: d, LeaseLeft: max(left, 0)}, nil
			}
		}
		// Past its TTL, or its lease expired with the same digest: free,
		// unless its owner's transaction still holds the row.
		if ownerAlive {
			return idempotency.Claim{State: idempotency.InProgress, Digest: d}, nil
		}
		tag, err = s.pool.Exec(ctx, `UPDATE idempotency_keys SET
				digest = $2, token = $3,
				lease_until = clock_timestamp() + $4::bigint * interval '1 microsecond',
				expires_at = clock_timestamp() + $5::bigint * interval '1 microsecond',
				status = 0, header = NULL, body = NULL
			WHERE key_hash = $1
				AND (expires_at <= clock_timestamp()
					OR (status = 0 AND lease_until <= clock_timestamp() AND digest = $2))
				AND key_hash IN (
					SELECT key_hash FROM idempotency_keys WHERE key_hash = $1
					FOR UPDATE SKIP LOCKED)`,
			k[:], req.Digest[:], tok,
			req.Lease.Microseconds(), req.TTL.Microseconds())
		if err != nil {
			return idempotency.Claim{}, fmt.Errorf("pgstore: take key over: %w", err)
		}
		if tag.RowsAffected() == 1 {
			c, ok, err := s.own(ctx, k, tok, req.TTL)
			if err != nil || ok {
				return c, err
			}
			continue
		}
		// Not taken over: its owner's transaction holds the row, or it
		// changed meanwhile. Look again: if it is still free by its lease
		// and TTL, its owner is alive.
		ownerAlive = true
	}
	return idempotency.Claim{}, fmt.Errorf("pgstore: key kept changing during %d claims", maxTries)
}

// own begins the owner's transaction for the claim of token and locks the
// key's row in it, for as long as it is open. It reports false if the
// claim was already taken over (a lease shorter than the time between the
// claim and the lock).
func (s *Store) own(ctx context.Context, k keyHash, token []byte, ttl time.Duration) (idempotency.Claim, bool, error) {
	// The transaction outlives the request's cancellation: the middleware
	// commits or aborts it.
	bg := context.WithoutCancel(ctx)
	// On failure the claim stays recorded, and the database may be down:
	// the caller releases it through the claim's Txn (idempotency.Store).
	claimOnly := idempotency.Claim{Txn: &txn{s: s, key: k, token: token, ttl: ttl}}
	tx, err := s.pool.Begin(bg)
	if err != nil {
		return claimOnly, false, fmt.Errorf("pgstore: begin: %w", err)
	}
	var one int
	err = tx.QueryRow(ctx, `SELECT 1 FROM idempotency_keys
		WHERE key_hash = $1 AND token = $2
		FOR UPDATE`, k[:], token).Scan(&one)
	if err != nil {
		_ = tx.Rollback(bg)
		if errors.Is(err, pgx.ErrNoRows) {
			return idempotency.Claim{}, false, nil
		}
		return claimOnly, false, fmt.Errorf("pgstore: lock claimed key: %w", err)
	}
	return idempotency.Claim{State: idempotency.Owned, Txn: &txn{s: s, tx: tx, key: k, token: token, ttl: ttl}}, true, nil
}

// keyHash is the hash by which the table keeps a key (idempotency.Key.Hash).
type keyHash = [32]byte

// release deletes the claim of token, if it still holds: not a key a
// commit completed (its token is NULL), nor one another claim took over.
func (s *Store) release(ctx context.Context, k keyHash, token []byte) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM idempotency_keys
		WHERE key_hash = $1 AND token = $2`, k[:], token)
	return err
}

// Sweep implements idempotency.Store, in one statement: the oldest
// expiry (through the index on expires_at) and the deletion. Concurrent
// sweeps from several servers skip each other's rows rather than wait.
func (s *Store) Sweep(ctx context.Context, limit int) (int, time.Duration, error) {
	var (
		n      int
		lagSec float64
	)
	err := s.pool.QueryRow(ctx, `WITH oldest AS (
			SELECT min(expires_at) AS at FROM idempotency_keys
		), deleted AS (
			DELETE FROM idempotency_keys WHERE key_hash IN (
				SELECT key_hash FROM idempotency_keys
				WHERE expires_at <= clock_timestamp() LIMIT $1 FOR UPDATE SKIP LOCKED)
			RETURNING 1
		)
		SELECT (SELECT count(*) FROM deleted),
			coalesce(extract(epoch FROM clock_timestamp() - (SELECT at FROM oldest)), 0)::float8`,
		limit).Scan(&n, &lagSec)
	if err != nil {
		return 0, 0, fmt.Errorf("pgstore: sweep: %w", err)
	}
	return n, max(0, time.Duration(lagSec*float64(time.Second))), nil
}

// CountKeys implements idempotency.KeyCounter with PostgreSQL's estimate of
// the table's live rows (its cumulative statistics, which follow inserts
// and deletes within seconds), so that it costs one lookup, not a scan.
func (s *Store) CountKeys(ctx context.Context) (int, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT pg_stat_get_live_tuples('idempotency_keys'::regclass)`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("pgstore: count keys: %w", err)
	}
	return int(n), nil
}

// A txn is an owner's transaction and claim; tx is nil for a claim whose
// transaction could not begin, which only Abort releases.
type txn struct {
	s     *Store
	tx    pgx.Tx
	key   keyHash
	token []byte
	ttl   time.Duration
}

func (t *txn) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxKey{}, t.tx)
}

func (t *txn) Commit(ctx context.Context, resp *idempotency.Response) error {
	if t.tx == nil {
		return errors.New("pgstore: commit: the claim's transaction never began")
	}
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
		WHERE key_hash = $5 AND token = $6`,
		resp.Status, header, body, t.ttl.Microseconds(), t.key[:], t.token)
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
	var err error
	if t.tx != nil {
		err = t.tx.Rollback(ctx)
	}
	if errors.Is(err, pgx.ErrTxClosed) {
		err = nil
	}
	if rerr := t.s.release(ctx, t.key, t.token); rerr != nil {
		return fmt.Errorf("pgstore: release claim: %w", rerr)
	}
	return err
}
